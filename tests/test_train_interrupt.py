"""Ctrl-C in ``aiayn train``: exit 130, one line naming the checkpoint it saved, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import aiayn as aiayn_package
from aiayn.cli.main import app

REPO = Path(__file__).resolve().parents[1]


def env() -> dict[str, str]:
    src = Path(aiayn_package.__file__).resolve().parents[1]  # the aiayn under test
    return {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "LC_ALL": "C"}


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-c", "import torch; torch.set_num_threads(1); from aiayn.cli.main import app; app()", *args]


def test_train_interrupt_exits_130_with_checkpoint_path(monkeypatch):
    import aiayn.stages.train as train_stage

    def interrupted(params, layout, recorder=None):
        raise InterruptedError("training interrupted at step 7; checkpoint saved in artifacts/checkpoints, rerun to resume")

    monkeypatch.setattr(train_stage, "run", interrupted)
    r = CliRunner().invoke(app, ["train", "--params", str(REPO / "configs" / "smoke.yaml")])
    assert r.exit_code == 130
    assert "interrupted at step 7; checkpoint saved in artifacts/checkpoints" in r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_train_sigint_end_to_end(multi30k_mirror, tmp_path):
    """Real SIGINT to `aiayn train` on the smoke config: checkpoint written, message, exit 130, no traceback."""
    import yaml

    params = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())
    params["train"].update(max_steps=100_000, checkpoint_every=5, keep_checkpoints=3, average_last=3)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    run_env = {**env(), "AIAYN_TRACKING": "off", "AIAYN_DATA_MIRROR": str(multi30k_mirror)}
    common = ["--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path)]
    for stage in (["fetch", "--mirror", str(multi30k_mirror), "--root", str(tmp_path)],
                  ["prepare", *common], ["tokenize", *common]):
        subprocess.run(aiayn(*stage), check=True, capture_output=True, env=run_env, timeout=300)
    proc = subprocess.Popen(aiayn("train", *common), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=run_env)
    deadline = time.monotonic() + 300
    while not list((tmp_path / "artifacts" / "checkpoints").glob("ckpt_*.json")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"checkpoint saved in {tmp_path / 'artifacts' / 'checkpoints'}" in err
