"""Integration (``services`` tier): real ``prefect server`` + deployments + a process worker.

Starts ``prefect server start`` on a free loopback port (``PREFECT_HOME`` in a temp
dir), deploys ``pipelines.deploy.DEPLOYMENTS`` for a scratch smoke project, checks
the schedules through the API, triggers the nightly ``pipeline`` deployment by hand,
runs a worker until the run ends, and checks the final state, the report artifact and
the four stage flow runs ``dvc repro`` reported to the same server. The server and the
worker run in their own process groups and are always stopped (fixture finalizers).

Run with ``pytest -m services``; takes ~3-6 minutes on 2 cores.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.services import free_port as _free_port
from support.services import start_process as _start
from support.services import stop_process as _stop
from support.services import tail as _tail
from support.services import wait_for as _wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
VENV_BIN = Path(sys.executable).parent

SERVER_START_TIMEOUT_S = 180
RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def services_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    return {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        # the deployments' schedules are stored and read back, but the scheduler makes no runs of them: the test's
        # worker would otherwise take an hourly (:00) or nightly (02:00 UTC) run when the test spans that minute,
        # and an hourly run holding the drift check's concurrency slot cancels the test's own (CANCEL_NEW)
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "DVC_NO_ANALYTICS": "1",
    }


@pytest.fixture(scope="module")
def prefect_server(services_env) -> Iterator[str]:
    """A real ``prefect server start`` on 127.0.0.1; yields its API URL; always stopped."""
    url = services_env["PREFECT_API_URL"]
    port = str(urllib.parse.urlsplit(url).port)
    log = Path(services_env["PREFECT_HOME"]) / "server.log"
    proc = _start(
        [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port],
        services_env,
        log,
    )

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        _wait_for(healthy, SERVER_START_TIMEOUT_S, f"prefect server at {url}")
        yield url
    finally:
        _stop(proc)


def _check_the_deployments(root: Path, ids: dict) -> None:
    """The deployments as the server reads them back: the nightly pipeline's and the hourly drift check's."""
    from prefect import get_client

    from pipelines.deploy import DEPLOYMENTS, WORK_POOL, load_flow

    assert set(ids) == {f"{load_flow(spec.flow).name}/{spec.name}" for spec in DEPLOYMENTS}

    with get_client(sync_client=True) as client:
        nightly = client.read_deployment_by_name("pipeline/nightly")
        assert nightly.id == ids["pipeline/nightly"]
        assert nightly.work_pool_name == WORK_POOL
        assert client.read_work_pool(WORK_POOL).type == "process"
        assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in nightly.schedules] == [
            ("0 2 * * *", "UTC", True)
        ]
        assert nightly.parameters == {"root": str(root), "push": True}
        # the hourly drift check: explicit timezone and "one at a time, cancel the newcomer", read back
        hourly = client.read_deployment_by_name("drift-check/hourly")
        assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in hourly.schedules] == [
            ("0 * * * *", "UTC", True)
        ]
        assert hourly.global_concurrency_limit.limit == 1
        assert hourly.concurrency_options.collision_strategy.value == "CANCEL_NEW"


def _run_on_a_worker(flow_run, services_env: dict[str, str], tmp_path: Path, multi30k_mirror):
    """Run a worker until the nightly run completes, then the drift check on German input; its final state."""
    from prefect import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment

    from pipelines.deploy import WORK_POOL
    from support.drift_inputs import read_split

    worker_log = tmp_path / "worker.log"
    worker = _start(
        [str(VENV_BIN / "prefect"), "worker", "start", "--pool", WORK_POOL, "--name", "test-worker"],
        {**services_env, "AIAYN_DATA_MIRROR": str(multi30k_mirror), "OMP_NUM_THREADS": "1"},
        worker_log,
    )
    try:
        with get_client(sync_client=True) as client:

            def final_state(run_id):
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited with {worker.returncode}:\n{_tail(worker_log)}")
                state = client.read_flow_run(run_id).state
                return state if state is not None and state.is_final() else None

            state = _wait_for(lambda: final_state(flow_run.id), RUN_TIMEOUT_S, f"flow run {flow_run.id}",
                              interval_s=3)
            assert state.type == StateType.COMPLETED, f"{state.type}: {state.message}\n{_tail(worker_log, 80)}"

            # the drift check on the worker, over the pipeline's reference: German input -> Failed
            german = tmp_path / "german.txt"
            german.write_text("\n".join(read_split(multi30k_mirror, "val", "de")[:60]) + "\n")
            drift_run = run_deployment("drift-check/hourly", parameters={"input_path": str(german)},
                                       timeout=0, as_subflow=False)
            drift_state = _wait_for(lambda: final_state(drift_run.id), 600, f"drift-check run {drift_run.id}",
                                    interval_s=3)
    finally:
        _stop(worker)
    return drift_state


def _report_and_stage_runs(flow_run) -> tuple[list, list, list[str]]:
    """The flow run's report artifacts, the stage flow runs it tagged, and their flows' names (sorted)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterTags,
    )

    from pipelines.pipeline import REPORT_KEY

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[REPORT_KEY])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
        )
        stage_runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"pipeline-run:{flow_run.id}"]))
        )
        stage_flows = sorted(client.read_flow(r.flow_id).name for r in stage_runs)
    return artifacts, stage_runs, stage_flows


@pytest.mark.timeout(SERVER_START_TIMEOUT_S + RUN_TIMEOUT_S + 300)
def test_nightly_deployment_runs_on_a_worker(prefect_server, services_env, tmp_path, multi30k_mirror):
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipelines.deploy import deploy
    from support.scratch import scratch_project
    from pipelines.dag import STAGES

    root = scratch_project(tmp_path / "project", SMOKE)
    with temporary_settings(updates={PREFECT_API_URL: prefect_server}):
        ids = deploy(root)
        _check_the_deployments(root, ids)

        flow_run = run_deployment("pipeline/nightly", timeout=0, as_subflow=False)
        drift_state = _run_on_a_worker(flow_run, services_env, tmp_path, multi30k_mirror)
        assert drift_state.type == StateType.FAILED, f"{drift_state.type}: {drift_state.message}"
        assert drift_state.message.startswith("drift in 60 production inputs")

        artifacts, stage_runs, stage_flows = _report_and_stage_runs(flow_run)
    assert len(artifacts) == 1 and artifacts[0].type == "markdown"
    for split in ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        assert f"| {split} |" in artifacts[0].data
    assert stage_flows == sorted(STAGES)
    assert all(r.state.type == StateType.COMPLETED for r in stage_runs)
    assert (root / "dvc.lock").is_file() and (root / "artifacts" / "eval_metrics.json").is_file()
