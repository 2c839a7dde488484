"""What Prefect shows of a stage that ends badly: its task run's state, not only its flow run's (a failed stage's
task run must not read ``Completed`` with only the flow ``Failed``)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


def _task_runs(flow_run_id) -> list:
    """The task runs of one flow run, from the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


@pytest.mark.parametrize("ending", ["bad input", "interrupted"])
def test_the_stage_task_run_ends_as_its_flow_run_with_the_stage_message(tmp_path, prefect_harness, monkeypatch, ending):
    """Bad input (prepare without a corpus): the task run and the flow run are ``Failed`` with the stage's one line.
    Interrupted (the stage raising ``InterruptedError`` as train does on SIGTERM): both ``Cancelled``, same message."""
    import aiayn.stages.prepare as prepare_stage
    from pipelines.flows import prepare

    (tmp_path / "params.yaml").write_text(SMOKE.read_text())
    if ending == "interrupted":
        def interrupted(params, layout, recorder=None):
            raise InterruptedError("stopped by SIGTERM at step 3; checkpoint saved in artifacts/checkpoints")

        monkeypatch.setattr(prepare_stage, "run", interrupted)
        want, message = "CANCELLED", "stopped by SIGTERM at step 3; checkpoint saved in artifacts/checkpoints"
    else:
        want, message = "FAILED", "CorpusError: raw corpus file(s) missing"
    state = prepare(root=str(tmp_path), return_state=True)
    (task,) = _task_runs(state.state_details.flow_run_id)
    assert (task.name, task.state.type.value, state.type.value) == ("prepare", want, want), (task.state, state)
    assert message in task.state.message and message in state.message


def _refusing_uri() -> str:
    """An http tracking URI whose port nothing listens on (the connection is refused at once)."""
    from support.services import free_port

    return f"http://127.0.0.1:{free_port()}"


def _tsv_project(root: Path) -> None:
    """The smoke config on a local TSV corpus of a few pairs: the corpus stage's inputs are all there."""
    import yaml

    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["data"] |= {"corpus": {"kind": "tsv", "path": "corpora/mine"}, "test_splits": ["test"]}
    cfg["quantize"]["gate_split"] = "test"
    (root / "params.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    folder = root / "corpora" / "mine"
    folder.mkdir(parents=True)
    pairs = {"train": "A dog runs on the grass.\tEin Hund rennt auf dem Gras.\nTwo men sit on a bench.\tZwei Männer "
                      "sitzen auf einer Bank.\n",
             "val": "A girl is reading a book.\tEin Mädchen liest ein Buch.\n",
             "test": "A woman rides a red bike.\tEine Frau fährt ein rotes Fahrrad.\n"}
    for split, text in pairs.items():
        (folder / f"{split}.tsv").write_text(text, encoding="utf-8")


def test_a_stage_whose_tracking_server_is_unreachable_fails_in_one_line(tmp_path, prefect_harness, monkeypatch):
    """The tracking server down when a tracked stage (prepare, its corpus snapshot made) records its run, through
    both entry points: ``aiayn prepare`` exits 1 with one line on stderr naming the store, and the ``prepare``
    flow's task and flow runs end ``Failed`` with the same ``TrackingLostError`` line, no traceback."""
    import subprocess
    import sys

    import os

    from pipelines.flows import prepare

    from aiayn.config.settings import TRACKING_ENV

    _tsv_project(tmp_path)
    aiayn = str(Path(sys.executable).parent / "aiayn")
    subprocess.run([aiayn, "corpus", "--root", str(tmp_path)], env={**os.environ, TRACKING_ENV: "0"},
                   check=True, capture_output=True, timeout=600)
    uri = _refusing_uri()
    monkeypatch.setenv(TRACKING_ENV, "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cli = subprocess.run([aiayn, "prepare", "--root", str(tmp_path)], capture_output=True, text=True, timeout=600)
    errors = [ln for ln in cli.stderr.strip().splitlines() if " INFO " not in ln]  # the stage's own log lines
    assert cli.returncode == 1, (cli.returncode, cli.stderr[-3000:])
    assert len(errors) == 1 and errors[0].startswith("aiayn prepare: error: stage prepare: its MLflow run could not "
                                                     f"be started in {uri}"), cli.stderr[-3000:]
    state = prepare(root=str(tmp_path), return_state=True)
    (task,) = _task_runs(state.state_details.flow_run_id)
    assert (task.state.type.value, state.type.value) == ("FAILED", "FAILED"), (task.state, state)
    for message in (task.state.message, state.message):
        assert message.startswith("TrackingLostError: stage prepare") and uri in message and "\n" not in message
