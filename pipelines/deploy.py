"""Deployments, schedules and the work pool of the aiayn flows, in one place (apart from flow code).

``DEPLOYMENTS`` is the whole schedule: one ``DeploymentSpec`` per deployment (flow,
cron or interval, parameters). ``WORK_POOL`` is the one pool they run on. Every
deployment gets ``root`` (the project folder, absolute) as a parameter and as the
worker's working directory; its other parameters are the spec's. A new scheduled
job is one more entry. Today: ``pipeline/nightly`` (retrain, 02:00 UTC) and
``drift-check/hourly`` (the drift monitor on the latest window of the serving log, at minute
0 of every hour, UTC; one run at a time, and a run that comes due while one is still running
is cancelled rather than queued, so a worker outage never leaves a pile of late checks), and
``adapt/daily`` (04:00 UTC, after the nightly retrain: adapts the champion to the reviewed corpus when
the drift checks or the reviews call for it, then gates; one run at a time, a new one cancelled meanwhile).

Usage (``PREFECT_API_URL`` names the server)::

    python -m pipelines.deploy deploy [--root DIR] [--pool NAME]  # register; a worker runs them
    python -m pipelines.deploy serve  [--root DIR]                # or run them from this process
    python -m pipelines.deploy deploy-cluster [--image IMG] [--gpus N]  # nightly on a GPU node (Kubernetes)
    python -m pipelines.deploy list                               # print the schedule

``deploy`` creates the work pool (type ``process``) when missing. Flows are
referenced by module path (``pipelines.pipeline.pipeline``), so the worker must
run in this project's venv (``aiayn`` and ``pipelines`` importable).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

from aiayn.config.settings import DVC_REMOTE_ENV

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.deployments.runner import RunnerDeployment

__all__ = [
    "ClusterJob",
    "K8S_WORK_POOL",
    "k8s_base_job_template",
    "cluster_job_variables",
    "build_cluster_deployment",
    "deploy_cluster",
    "DeploymentSpec",
    "WORK_POOL",
    "WORK_POOL_TYPE",
    "DEPLOYMENTS",
    "load_flow",
    "build_deployments",
    "ensure_work_pool",
    "deploy",
    "serve",
    "main",
]

#: The work pool every deployment runs on; start its worker with
#: ``prefect worker start --pool aiayn-process``.
WORK_POOL = "aiayn-process"
#: Process pool: each flow run is a subprocess of the worker, on the worker's machine.
WORK_POOL_TYPE = "process"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: ``<flow name>/<name>`` on ``WORK_POOL``, on a cron or interval schedule.

    ``flow`` is ``"module:attribute"`` of a Prefect flow whose first parameter is
    ``root``. ``cron`` (5 fields, in ``timezone``) or ``interval_s`` (seconds) or
    neither (run by hand only). ``concurrency_limit`` bounds overlapping runs
    (1: two ``dvc repro`` on one project never race).
    """

    name: str
    flow: str
    description: str
    cron: str | None = None
    interval_s: float | None = None
    timezone: str = "UTC"
    parameters: dict[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ("aiayn",)
    concurrency_limit: int | None = 1
    collision_strategy: str = "ENQUEUE"  # or CANCEL_NEW: a run due while the limit is full is cancelled

    def __post_init__(self) -> None:
        if self.collision_strategy not in ("ENQUEUE", "CANCEL_NEW"):
            raise ValueError(f"deployment {self.name!r}: collision_strategy must be ENQUEUE or CANCEL_NEW, "
                             f"got {self.collision_strategy!r}")
        if self.cron is not None and self.interval_s is not None:
            raise ValueError(f"deployment {self.name!r}: give cron or interval_s, not both")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"deployment {self.name!r}: interval_s must be > 0, got {self.interval_s}")
        if ":" not in self.flow:
            raise ValueError(f"deployment {self.name!r}: flow must be 'module:attribute', got {self.flow!r}")
        if "root" in self.parameters:
            raise ValueError(f"deployment {self.name!r}: 'root' is set at deploy time, not in parameters")


#: Every scheduled job of the project.
DEPLOYMENTS: tuple[DeploymentSpec, ...] = (
    DeploymentSpec(
        name="nightly",
        flow="pipelines.pipeline:pipeline",
        cron="0 2 * * *",
        parameters={"push": True},
        description="Nightly retrain: fetch, dvc repro (DVC decides what is stale), dvc push, report artifact",
    ),
    DeploymentSpec(
        name="hourly",
        flow="pipelines.drift_flow:drift",
        cron="0 * * * *",
        timezone="UTC",
        concurrency_limit=1,
        collision_strategy="CANCEL_NEW",
        description="Drift of the latest served inputs against the training reference (Evidently); Failed on drift",
    ),
    DeploymentSpec(
        name="daily",
        flow="pipelines.adapt_flow:adapt",
        cron="0 4 * * *",
        timezone="UTC",
        parameters={"push": True},
        concurrency_limit=1,
        collision_strategy="CANCEL_NEW",
        description="Adapt the champion to the reviewed corpus when N drift checks in a row drifted or K new "
                    "reviewed pairs came in; the two-sided promotion gate decides",
    ),
)


#: The cluster pool: each flow run is a Kubernetes Job started by a ``prefect-kubernetes`` worker
#: (``prefect worker start --pool aiayn-k8s``, running anywhere that can reach the cluster's API).
K8S_WORK_POOL = "aiayn-k8s"
K8S_WORK_POOL_TYPE = "kubernetes"
#: Variables every cluster flow run gets from the deploying environment (where the team's services
#: are): the MLflow server, the S3 DVC remote and the Prefect API. Credentials never travel this way:
#: they come from the Kubernetes Secret ``ClusterJob.s3_secret`` (``envFrom``).
CLUSTER_ENV = ("MLFLOW_TRACKING_URI", DVC_REMOTE_ENV, "AWS_ENDPOINT_URL_S3", "PREFECT_API_URL")


@dataclass(frozen=True)
class ClusterJob:
    """What a flow run on ``K8S_WORK_POOL`` gets: the project image (``Dockerfile``, built with
    ``--build-arg TORCH_VARIANT=cu128`` for a GPU node; the project lives at ``root`` in it), GPUs
    (``nvidia.com/gpu``, the NVIDIA device plugin's resource; a toleration for its taint), CPU and
    memory requests, and the Secret holding ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``."""

    image: str = "aiayn:cu128"
    namespace: str = "aiayn"
    gpus: int = 1
    cpu: str = "8"
    memory: str = "64Gi"
    s3_secret: str = "aiayn-s3"
    root: str = "/app"


def k8s_base_job_template() -> dict[str, Any]:
    """The cluster pool's base job template: ``prefect-kubernetes``' default Job, plus a GPU limit
    (variable ``gpu_limit``), a toleration for ``nvidia.com/gpu`` and ``envFrom`` the Secret named by
    variable ``s3_secret``."""
    import copy

    from prefect_kubernetes.worker import KubernetesWorker

    template = copy.deepcopy(KubernetesWorker.get_default_base_job_template())
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "{{ gpu_limit }}"
    container["envFrom"] = [{"secretRef": {"name": "{{ s3_secret }}"}}]
    pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    props = template["variables"]["properties"]
    props["gpu_limit"] = {"type": "integer", "default": 0, "title": "GPUs",
                          "description": "nvidia.com/gpu limit of the flow-run container"}
    props["s3_secret"] = {"type": "string", "default": "aiayn-s3", "title": "S3 credentials Secret",
                          "description": "Kubernetes Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"}
    return template


def cluster_job_variables(job: ClusterJob, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Job variables of a cluster deployment: ``job`` plus the ``CLUSTER_ENV`` values found in ``env``
    (default: this process's environment). Raises ``ValueError`` when ``MLFLOW_TRACKING_URI`` is missing
    or local (a pod cannot reach this machine's SQLite store)."""
    env = os.environ if env is None else env
    passed = {k: env[k] for k in CLUSTER_ENV if env.get(k)}
    if not passed.get("MLFLOW_TRACKING_URI", "").startswith(("http://", "https://")):
        raise ValueError("a cluster deployment needs MLFLOW_TRACKING_URI = the team's MLflow server (http[s]://...); "
                         f"got {passed.get('MLFLOW_TRACKING_URI')!r}")
    return {"image": job.image, "namespace": job.namespace, "gpu_limit": job.gpus, "cpu_request": job.cpu,
            "memory_request": job.memory, "s3_secret": job.s3_secret, "env": passed,
            "labels": {"app.kubernetes.io/name": "aiayn"}}


def build_cluster_deployment(spec: DeploymentSpec, job: ClusterJob = ClusterJob(),
                             env: Mapping[str, str] | None = None) -> RunnerDeployment:
    """``spec`` as a deployment on ``K8S_WORK_POOL`` (named ``<spec.name>-gpu``), running the project
    at ``job.root`` inside ``job.image``."""
    from prefect.deployments.runner import EntrypointType

    return load_flow(spec.flow).to_deployment(
        name=f"{spec.name}-gpu", schedules=_schedules(spec), parameters={"root": job.root, **spec.parameters},
        description=f"{spec.description} (Kubernetes, {job.gpus} GPU)", tags=[*spec.tags, "gpu"],
        work_pool_name=K8S_WORK_POOL, job_variables=cluster_job_variables(job, env),
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def load_flow(ref: str) -> Flow:
    """Import ``"module:attribute"`` and return the flow. Raises ``ValueError`` if it is not a flow."""
    from prefect import Flow

    module_name, _, attr = ref.partition(":")
    obj = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(obj, Flow):
        raise ValueError(f"{ref!r} is not a Prefect flow (got {type(obj).__name__})")
    return obj


def _schedules(spec: DeploymentSpec) -> list[Any]:
    from prefect.schedules import Cron, Interval

    if spec.cron is not None:
        return [Cron(spec.cron, timezone=spec.timezone)]
    if spec.interval_s is not None:
        return [Interval(spec.interval_s, timezone=spec.timezone)]
    return []


def build_deployments(
    root: str | Path,
    specs: tuple[DeploymentSpec, ...] = DEPLOYMENTS,
    work_pool: str | None = WORK_POOL,
) -> list[RunnerDeployment]:
    """``RunnerDeployment`` objects for ``specs`` on project ``root`` (``work_pool=None``: for ``serve``)."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.deployments.runner import EntrypointType

    root = str(Path(root).resolve())
    deployments = []
    for spec in specs:
        deployments.append(
            load_flow(spec.flow).to_deployment(
                name=spec.name,
                schedules=_schedules(spec),
                parameters={"root": root, **spec.parameters},
                description=spec.description,
                tags=list(spec.tags),
                concurrency_limit=None if spec.concurrency_limit is None else ConcurrencyLimitConfig(
                    limit=spec.concurrency_limit,
                    collision_strategy=ConcurrencyLimitStrategy[spec.collision_strategy]),
                work_pool_name=work_pool,
                job_variables={"working_dir": root} if work_pool else None,
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        )
    return deployments


def ensure_work_pool(name: str = WORK_POOL, pool_type: str = WORK_POOL_TYPE) -> None:
    """Create work pool ``name`` of ``pool_type`` (``process``: its default job template;
    ``kubernetes``: ``k8s_base_job_template()``), unless it exists."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    if pool_type == "process":
        template = ProcessWorker.get_default_base_job_template()
    elif pool_type == K8S_WORK_POOL_TYPE:
        template = k8s_base_job_template()
    else:
        raise ValueError(f"only 'process' and 'kubernetes' work pools are set up here, got {pool_type!r}")
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type=pool_type, base_job_template=template))


def deploy_cluster(job: ClusterJob = ClusterJob(), specs: tuple[DeploymentSpec, ...] = DEPLOYMENTS[:1]) -> dict[str, UUID]:
    """Register ``specs`` (default: the nightly retrain) on ``K8S_WORK_POOL`` (created if missing)."""
    ensure_work_pool(K8S_WORK_POOL, K8S_WORK_POOL_TYPE)
    ids: dict[str, UUID] = {}
    for spec in specs:
        d = build_cluster_deployment(spec, job)
        ids[f"{d.flow_name}/{d.name}"] = d.apply(work_pool_name=K8S_WORK_POOL)
    return ids


def deploy(
    root: str | Path = ".", work_pool: str = WORK_POOL, specs: tuple[DeploymentSpec, ...] = DEPLOYMENTS
) -> dict[str, UUID]:
    """Register ``specs`` for project ``root`` on ``work_pool`` (created if missing); return ``{full name: id}``.

    Re-deploying updates the deployments in place (same names, new schedules/parameters).
    """
    ensure_work_pool(work_pool)
    ids: dict[str, UUID] = {}
    for spec, deployment in zip(specs, build_deployments(root, specs, work_pool)):
        ids[f"{deployment.flow_name}/{spec.name}"] = deployment.apply(work_pool_name=work_pool)
    return ids


def serve(root: str | Path = ".", specs: tuple[DeploymentSpec, ...] = DEPLOYMENTS) -> None:
    """Serve ``specs`` from this process (no work pool or worker needed); blocks until interrupted."""
    from prefect import serve as prefect_serve

    prefect_serve(*build_deployments(root, specs, work_pool=None))


def _describe(spec: DeploymentSpec) -> str:
    when = f"cron '{spec.cron}' {spec.timezone}" if spec.cron else (
        f"every {spec.interval_s:g} s" if spec.interval_s else "by hand only"
    )
    flow_name = load_flow(spec.flow).name
    limit = (f"; at most {spec.concurrency_limit} running ({spec.collision_strategy} on collision)"
             if spec.concurrency_limit else "")
    return f"{flow_name}/{spec.name}: {when}{limit}; parameters {spec.parameters}; {spec.description}"


def main(argv: list[str] | None = None) -> int:
    """CLI: ``deploy``, ``serve`` or ``list`` (see the module doc)."""
    from pipelines import apply_project_env

    apply_project_env()  # before Prefect is imported
    parser = argparse.ArgumentParser(prog="python -m pipelines.deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_deploy = sub.add_parser("deploy", help="register the deployments on the Prefect server")
    p_deploy.add_argument("--root", default=".", help="project root the runs work in (default: .)")
    p_deploy.add_argument("--pool", default=WORK_POOL, help=f"work pool (default: {WORK_POOL})")
    p_cluster = sub.add_parser("deploy-cluster", help="register the nightly retrain on the Kubernetes work pool")
    p_cluster.add_argument("--image", default=ClusterJob.image, help=f"project image (default: {ClusterJob.image})")
    p_cluster.add_argument("--namespace", default=ClusterJob.namespace)
    p_cluster.add_argument("--gpus", type=int, default=ClusterJob.gpus)
    p_serve = sub.add_parser("serve", help="serve the deployments from this process")
    p_serve.add_argument("--root", default=".", help="project root the runs work in (default: .)")
    sub.add_parser("list", help="print the deployments and their schedules")
    args = parser.parse_args(argv)

    if args.command == "list":
        print(f"work pool: {WORK_POOL} ({WORK_POOL_TYPE})")
        for spec in DEPLOYMENTS:
            print(_describe(spec))
    elif args.command == "deploy":
        for name, deployment_id in deploy(args.root, args.pool).items():
            print(f"deployed {name} ({deployment_id}) on work pool {args.pool}")
        print(f"start a worker: prefect worker start --pool {args.pool}")
    elif args.command == "deploy-cluster":
        job = ClusterJob(image=args.image, namespace=args.namespace, gpus=args.gpus)
        for name, deployment_id in deploy_cluster(job).items():
            print(f"deployed {name} ({deployment_id}) on work pool {K8S_WORK_POOL}")
        print(f"start a worker where the cluster is reachable: prefect worker start --pool {K8S_WORK_POOL}")
    else:
        serve(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
