"""Deployments, schedules and the work pool of the aiayn flows, in one place (apart from flow code).

``DEPLOYMENTS`` is the whole schedule: one ``DeploymentSpec`` per deployment (flow,
cron or interval, parameters). ``WORK_POOL`` is the one pool they run on. Every
deployment gets ``root`` (the project folder, absolute) as a parameter and as the
worker's working directory; its other parameters are the spec's. A new scheduled
job is one more entry. Today: ``pipeline/nightly`` (retrain, 02:00 UTC) and
``drift-check/hourly`` (the drift monitor on the latest window of the serving log, at minute
0 of every hour, UTC; one run at a time, and a run that comes due while one is still running
is cancelled rather than queued, so a worker outage never leaves a pile of late checks).

Usage (``PREFECT_API_URL`` names the server)::

    python -m pipelines.deploy deploy [--root DIR] [--pool NAME]  # register; a worker runs them
    python -m pipelines.deploy serve  [--root DIR]                # or run them from this process
    python -m pipelines.deploy list                               # print the schedule

``deploy`` creates the work pool (type ``process``) when missing. Flows are
referenced by module path (``pipelines.pipeline.pipeline``), so the worker must
run in this project's venv (``aiayn`` and ``pipelines`` importable).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.deployments.runner import RunnerDeployment

__all__ = [
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
        flow="monitoring.flows:drift",
        cron="0 * * * *",
        timezone="UTC",
        concurrency_limit=1,
        collision_strategy="CANCEL_NEW",
        description="Drift of the latest served inputs against the training reference (Evidently); Failed on drift",
    ),
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
    """Create work pool ``name`` of ``pool_type`` with its default job template, unless it exists."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    if pool_type != "process":
        raise ValueError(f"only 'process' work pools are set up here, got {pool_type!r}")
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=name, type=pool_type, base_job_template=ProcessWorker.get_default_base_job_template()
                )
            )


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
    parser = argparse.ArgumentParser(prog="python -m pipelines.deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_deploy = sub.add_parser("deploy", help="register the deployments on the Prefect server")
    p_deploy.add_argument("--root", default=".", help="project root the runs work in (default: .)")
    p_deploy.add_argument("--pool", default=WORK_POOL, help=f"work pool (default: {WORK_POOL})")
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
    else:
        serve(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
