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
