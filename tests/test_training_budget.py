"""The training budget's safety net, really run: ``max_epochs`` and ``max_time_s`` stop the loop
(``aiayn.train.trainer.Trainer.should_stop``), and a run cut by the clock goes down the whole "training CUT"
chain of a real pipeline run.

Fast tier: a tiny model trained with ``aiayn.train.train`` stops by ``max_epochs`` after exactly the epochs'
batches, and by ``max_time_s`` at exactly the step the clock says, with no wall-clock race: the trainer's
clock (``time.perf_counter`` as ``aiayn.train.trainer`` reads it) is replaced by one that moves only when a
step ends, by a known amount.

Slow tier: ``python -m pipelines.pipeline`` on a scratch project whose ``train.max_time_s`` is 1 ns, so the
trainer's first clock check (before step 1) already finds the budget spent: the run is cut at step 0 every
time. The process exits ``EXIT_TRAINING_CUT`` (3), the registry gives the exported version ``challenger`` and
no ``champion``, and the printed report, the MLflow pipeline run's description and the model card each open
with "training CUT by max_time_s".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from aiayn.checkpoint import checkpoint_step, list_checkpoints
from aiayn.config.schema import ModelConfig, TrainConfig
from aiayn.data.batching import make_batches
from aiayn.exitcodes import EXIT_TRAINING_CUT, training_was_cut
from aiayn.stages.train import budget_line
from aiayn.tokenizer import EncodedSplit
from aiayn.train import train

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
BIN = Path(sys.executable).parent

VOCAB = 40
MODEL = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.1, attention_backend="sdpa")


def synthetic_split(n: int = 48, seed: int = 0) -> EncodedSplit:
    """Random pairs (lengths 2..10, ids 4..VOCAB-1: no special ids), as in tests/test_train.py."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, VOCAB, size=int(rng.integers(2, 11))) for _ in range(n)]
    tgt = [(s * 7) % (VOCAB - 4) + 4 for s in src]

    def pack(seqs):
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(x) for x in seqs])
        return np.concatenate(seqs).astype(np.int32), offsets

    (s_ids, s_off), (t_ids, t_off) = pack(src), pack(tgt)
    return EncodedSplit(src_ids=s_ids, src_offsets=s_off, tgt_ids=t_ids, tgt_offsets=t_off)


def cfg(**kw) -> TrainConfig:
    base = dict(seed=3, data_seed=5, max_steps=12, max_tokens=64, warmup_steps=4, lr_scale=2.0, validate_every=1000,
                checkpoint_every=1000, keep_checkpoints=3, average_last=2, log_every=1)
    return TrainConfig(**(base | kw))


# --------------------------------------------------------------------------- fast: the trainer's budgets


@pytest.mark.parametrize("max_epochs", [1, 2])
def test_training_stops_by_max_epochs_after_exactly_the_epochs_batches(tmp_path, max_epochs):
    """``max_epochs`` ends the run at the end of its last epoch: one update per batch (grad_accum 1) of every
    epoch's batching (``make_batches``, reshuffled per epoch), no more, no fewer, far below ``max_steps``."""
    split, c = synthetic_split(), cfg(max_steps=10_000, max_epochs=max_epochs)
    batches = [len(make_batches(split.src_lengths, split.tgt_lengths, c.max_tokens, data_seed=c.data_seed, epoch=e))
               for e in range(1, max_epochs + 1)]
    want = sum(batches)
    assert min(batches) >= 3  # several batches per epoch: a stop mid-epoch, or an epoch late, would show

    result = train(MODEL, c, split, None, tmp_path / "ck")

    assert (result.stopped_by, result.step, result.epoch) == ("max_epochs", want, max_epochs)
    assert sorted(result.losses) == list(range(1, want + 1))
    assert checkpoint_step(list_checkpoints(tmp_path / "ck")[-1]) == want  # the last step is checkpointed
    budget = budget_line(result.stopped_by, result.step, c)
    assert budget == f"complete: max_epochs {max_epochs} reached at step {want}" and not training_was_cut(budget)


class SteppedClock:
    """``time`` for ``aiayn.train.trainer``: ``perf_counter()`` moves only when a training step ends, by
    ``step_s`` (``Trainer.step`` is wrapped to advance it); every other attribute is the real ``time``'s."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 1000.0, step_s

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def stepped_clock(monkeypatch):
    """Each training step "takes" 0.5 s on the trainer's clock, whatever it really takes."""
    import aiayn.train.trainer as trainer_mod

    clock = SteppedClock(0.5)
    step = trainer_mod.Trainer.step

    def timed_step(self) -> None:
        step(self)
        clock.now += clock.step_s

    monkeypatch.setattr(trainer_mod, "time", clock)
    monkeypatch.setattr(trainer_mod.Trainer, "step", timed_step)
    return clock


@pytest.mark.parametrize("max_time_s, want_step", [(1.75, 4), (2.0, 4), (0.25, 1), (100.0, None)])
def test_training_stops_by_max_time_s_at_exactly_the_step_the_clock_says(tmp_path, stepped_clock, max_time_s, want_step):
    """The clock is checked before every update: with 0.5 s per step, a 1.75 s budget is spent after step 4
    (1.5 s < 1.75 s after step 3), a 2.0 s budget too (the check is ``>=``), a 0.25 s one after step 1 (the
    first check, at 0 s, lets a step run); the run is checkpointed there and its budget line is the report's
    "CUT by max_time_s at step N". A budget longer than the run leaves it to ``max_steps`` (12)."""
    c = cfg(max_time_s=max_time_s)
    result = train(MODEL, c, synthetic_split(), None, tmp_path / "ck")

    budget = budget_line(result.stopped_by, result.step, c)
    if want_step is None:
        assert (result.stopped_by, result.step) == ("max_steps", c.max_steps)
        assert budget == "complete: max_steps 12 reached" and not training_was_cut(budget)
        return
    assert (result.stopped_by, result.step) == ("max_time_s", want_step)
    assert sorted(result.losses) == list(range(1, want_step + 1))
    assert result.train_seconds == want_step * stepped_clock.step_s  # the run's clock is the one read for the cut
    assert checkpoint_step(list_checkpoints(tmp_path / "ck")[-1]) == want_step
    assert budget.startswith(f"CUT by max_time_s at step {want_step} of max_steps 12: training did not finish")
    assert training_was_cut(budget)


# --------------------------------------------------------------------------- slow: the "training CUT" chain


def _cut_params(path: Path) -> Path:
    """``configs/smoke.yaml`` with ``train.max_time_s`` 1 ns (spent at the first clock check: cut at step 0, every
    time) and everything after training made smaller (one test split, fewer sentences, no throughput), so the
    run is short. ``max_steps`` 20: were the clock ignored, training would end by its step budget quickly."""
    p = yaml.safe_load(SMOKE.read_text())
    p["data"] |= {"max_train_pairs": 500, "max_eval_pairs": 16, "test_splits": ["test_2016_flickr"]}
    p["tokenize"]["vocab_size"] = 500
    p["train"] |= {"max_time_s": 1e-9, "max_steps": 20, "warmup_steps": 5, "validate_every": 10,
                   "checkpoint_every": 10, "keep_checkpoints": 2, "average_last": 2}
    p["evaluate"] |= {"beam_size": 1, "max_len_b": 5}
    p["quantize"] |= {"score_check_sentences": 4, "calibration_sentences": 8, "throughput": False}
    p["monitor"] |= {"reference_sentences": 100, "embedding_dims": 8}
    path.write_text(yaml.safe_dump(p))
    return path


@pytest.mark.slow
def test_a_pipeline_cut_by_max_time_s_exits_3_and_never_makes_a_champion(tmp_path, prefect_harness, multi30k_mirror):
    """The real chain from ``train.max_time_s`` to the people reading the run: the trainer stops by the clock,
    the train stage writes the CUT budget line, the pipeline exits 3 (``make run && ...`` stops), export
    registers the version as ``challenger`` (the first version of a fresh registry: it would be champion had
    training finished), and the printed report, the pipeline run's MLflow description and the model card all
    open with "training CUT by max_time_s"."""
    from support.scratch import scratch_project

    root = scratch_project(tmp_path / "project", _cut_params(tmp_path / "cut.yaml"), git=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "AIAYN_PARENT_RUN_ID")} | {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "AIAYN_DATA_MIRROR": str(multi30k_mirror),
        "PREFECT_API_URL": prefect_harness, "OMP_NUM_THREADS": "1", "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipelines.pipeline", "--root", str(root), "--no-push"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - t0
    print(f"cut pipeline run: {seconds:.0f} s")
    said = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == EXIT_TRAINING_CUT == 3, said
    _check_the_cut_chain(root, proc.stdout, proc.stderr, tmp_path / "dl", said)


def _check_the_cut_chain(root: Path, stdout: str, stderr: str, downloads: Path, said: str = "") -> None:
    """What a pipeline run cut at step 0 by ``train.max_time_s`` left for people: the train stage's budget line,
    the exit message, the report printed and logged, the pipeline run's description, the model card, the registry."""
    from mlflow import MlflowClient

    metrics = json.loads((root / "artifacts" / "train_metrics.json").read_text())
    assert (metrics["stopped_by"], metrics["step"]) == ("max_time_s", 0), metrics
    budget = metrics["budget"]
    assert budget.startswith("CUT by max_time_s at step 0 of max_steps 20: training did not finish"), budget
    assert f"pipeline finished, but training was {budget} (exit 3)" in stderr, said

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("aiayn").experiment_id])}
    assert runs["train"].data.tags["train.budget_cut"] == "max_time_s"
    parent = client.get_run(runs["train"].data.tags["mlflow.parentRunId"])
    assert runs["orchestrate"].data.tags["mlflow.parentRunId"] == parent.info.run_id

    # the printed report is the pipeline's report (the copy the flow logs on its ``orchestrate`` run), which
    # opens with the cut
    report = Path(client.download_artifacts(runs["orchestrate"].info.run_id, "pipeline_report.md",
                                            str(downloads))).read_text()
    assert stdout.rstrip().endswith(report.rstrip()), said
    assert report.splitlines()[0] == f"> **WARNING: training {budget}**"
    assert parent.info.run_id in report
    # the MLflow pipeline run's description
    description = parent.data.tags["mlflow.note.content"]
    assert description.splitlines()[0].startswith("**WARNING: training CUT by max_time_s at step 0"), description
    # the model card
    card = (root / "artifacts" / "export" / "model_card.md").read_text()
    assert card.splitlines()[0] == f"> **WARNING: training {budget}**"

    # the registry: the one version is the challenger; there is no champion
    (name,) = [m.name for m in client.search_registered_models()]
    (version,) = client.search_model_versions(f"name = '{name}'")
    aliases = {alias: str(v) for alias, v in client.get_registered_model(name).aliases.items()}
    assert aliases == {"challenger": str(version.version)} and "champion" not in aliases, aliases
    assert client.get_model_version_by_alias(name, "challenger").tags["train.budget_cut"] == "max_time_s"
