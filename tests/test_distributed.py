"""Data-parallel training (torchrun + gloo DDP on CPU): world-size-invariant updates and exact resume.

Every test here starts real ``torchrun`` jobs (2 ranks, gloo) on test_train's synthetic task.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.config.schema import ConfigError, params_from_dict
from aiayn.train.distributed import (SHUTDOWN_GRACE_S, World, agree, all_reduce_sum, rank_device, torchrun_command,
                               world_from_env)
from aiayn.data.batching import EpochBatchIterator
from aiayn.train import dropout_seed, train
from test_train import MODEL, assert_bitwise_equal, cfg, synthetic_split, weights

TESTS = Path(__file__).resolve().parent
STEPS = 20


def torchrun(nproc: int, out: Path, ckpt: Path, max_steps: int, grad_accum: int, *, hold_at: int = 0,
             wait: bool = True, mode: str = "ddp") -> subprocess.Popen | subprocess.CompletedProcess:
    # the train stage's own launcher line (its shutdown grace included), running the test worker
    cmd = torchrun_command(nproc, "support.ddp_worker", str(out), str(ckpt), str(max_steps), str(grad_accum),
                           str(hold_at))
    env = {**os.environ, "PYTHONPATH": str(TESTS), "AIAYN_TEST_DISTRIBUTED": mode, "PYTHONFAULTHANDLER": "1"}
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    before = out.parent / f"{ckpt.name}.before" if ckpt.exists() else None
    if before is not None:
        shutil.copytree(ckpt, before)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    said = proc.stdout + proc.stderr
    if proc.returncode != 0 and killed_by_signal(said):
        # A rank died of a native crash: once in CI (79aa81b), a SIGSEGV in rank 0 inside torch's gloo
        # all-gather of FSDP2's full state dict; thousands of gathers on this host never repeated it. Run the
        # identical job once more from the same inputs, loudly: a real fault of ours fails both times.
        warnings.warn(f"torchrun job {out.name}: a rank was killed by a signal; rerunning it once from the same "
                      f"inputs. Its output:\n{said[-6000:]}", stacklevel=2)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(ckpt, ignore_errors=True)
        if before is not None:
            shutil.copytree(before, ckpt)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    return proc


def killed_by_signal(launcher_output: str) -> bool:
    """Whether torchrun's failure report names a rank that a signal ended (``exitcode : -11 ... (SIGSEGV)``),
    other than the SIGTERM torchrun sends the other ranks once one failed."""
    return any(int(code) < 0 and int(code) != -signal.SIGTERM
               for code in re.findall(r"exitcode\s*:\s*(-?\d+)", launcher_output))


def steps_of(out: Path) -> dict:
    return json.loads((out / "steps.json").read_text())


#: The loss path each mode runs: FSDP takes the plain logits path (its sharded output weight is not whole outside
#: the forward), so its one-process reference does too; DDP and one process take the default fused loss.
LOSS_PATH = {"ddp": {}, "fsdp": {"loss_chunk_tokens": None}}


def one_process(tmp_path: Path, max_steps: int, grad_accum: int, name: str = "one", mode: str = "ddp"):
    """The reference: one process, grad_accum batches per update, 1 thread like each torchrun rank, the loss
    path of ``mode`` (``LOSS_PATH``)."""
    per_step: dict[int, list[float]] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(MODEL, cfg(max_steps=max_steps, grad_accum=grad_accum, checkpoint_every=5, keep_checkpoints=20,
                                  **LOSS_PATH[mode]),
                       synthetic_split(96), None, tmp_path / name,
                       on_step=lambda s, m: per_step.__setitem__(s, [m["loss"], m["tokens"], m["grad_norm"]]))
    finally:
        torch.set_num_threads(threads)
    return result, per_step


#: Weights whose gradient is zero in exact arithmetic: a key bias adds ``q . b_k`` to every attention logit of a
#: query, which softmax ignores, so its gradient is rounding noise (~1e-9), and Adam (eps 1e-9) turns noise into
#: lr-sized steps of either sign. Its values are then the run's rounding, different under other sums (an Intel
#: host's MKL kernels: 0.19 apart after 20 steps, FSDP against one process), and have no effect on the output.
NOISE_ONLY = ("self_attn.k_proj.bias", "cross_attn.k_proj.bias")


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 5e-5) -> float:
    """The largest difference between two state dicts, NOISE_ONLY left out; fails above ``atol``. The rest differ
    by rounding (up to 1.1e-5 seen, the k projections beside those biases)."""
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a if not k.endswith(NOISE_ONLY))
    assert worst <= atol, f"weights differ by up to {worst:.3g}"
    return worst


# --- units -------------------------------------------------------------------------------------------------


def test_world_from_torchrun_environment():
    assert world_from_env({}) == World()
    w = world_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (w.rank, w.world_size, w.local_rank, w.is_main, w.distributed) == (1, 2, 1, False, True)
    with pytest.raises(ValueError, match="inconsistent"):
        world_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    assert agree(World(), True, False) == (True, False)
    assert all_reduce_sum(World(), [1.5]) == [1.5]


def test_rank_device_follows_train_device_and_local_rank():
    """The one device rule of the trainer and the torchrun worker: ``cuda:<local_rank>`` or the CPU."""
    w = World(rank=1, world_size=2, local_rank=1)
    assert rank_device("cpu", w) == torch.device("cpu")
    assert rank_device("cuda", w) == torch.device("cuda", 1)
    assert rank_device("auto", w) == (torch.device("cuda", 1) if torch.cuda.is_available() else torch.device("cpu"))
    assert rank_device("cuda", World()).index == 0


def test_torchrun_command_uses_this_interpreter():
    cmd = torchrun_command(4, "aiayn.stages.train_worker", "root", "job")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc_per_node=4" in cmd and cmd[-4:] == ["-m", "aiayn.stages.train_worker", "root", "job"]
    assert f"--shutdown-timeout={SHUTDOWN_GRACE_S}" in cmd
    with pytest.raises(ValueError):
        torchrun_command(0, "m")


@pytest.mark.slow
def test_after_a_signal_the_launcher_waits_for_ranks_that_take_longer_than_torchruns_30_s(tmp_path):
    """SIGTERM to the stage's torchrun line: each rank gets ``SHUTDOWN_GRACE_S`` to stop (it finishes its
    update and rank 0 checkpoints), not torchrun's own 30 s, after which it would be SIGKILLed and the
    steps since the last checkpoint lost. The ranks here take 40 s to stop (``support.slow_stop_rank``)."""
    from support.slow_stop_rank import STOP_S

    proc = subprocess.Popen(torchrun_command(2, "support.slow_stop_rank", str(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(TESTS)})
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready.*"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=STOP_S + 240)[0].decode(errors="replace")
    assert alive and sorted(p.name for p in tmp_path.glob("stopped.*")) == ["stopped.0", "stopped.1"], out[-4000:]


def test_only_a_rank_ended_by_a_signal_other_than_torchruns_sigterm_counts_as_killed():
    crash = ("  [1]:\n    rank      : 1 (local_rank: 1)\n    exitcode  : -15 (pid: 9474)  (SIGTERM)\n"
             "Root Cause (first observed failure):\n  [0]:\n    exitcode  : -11 (pid: 9473)  (SIGSEGV)\n")
    assert killed_by_signal(crash)
    assert not killed_by_signal(crash.replace("-11 (pid: 9473)  (SIGSEGV)", "1 (pid: 9473)"))  # an error of ours
    assert not killed_by_signal("    exitcode  : -15 (pid: 9474)  (SIGTERM)\n")  # torchrun stopping the ranks
    assert not killed_by_signal("assert proc.returncode == 0")


def test_config_refuses_inconsistent_world():
    with pytest.raises(ConfigError, match="needs train.distributed: ddp"):
        params_from_dict({"train": {"nproc_per_node": 2}})
    with pytest.raises(ConfigError, match="multiple of train.nproc_per_node"):
        params_from_dict({"train": {"distributed": "ddp", "nproc_per_node": 2, "grad_accum": 3}})
    ok = params_from_dict({"train": {"distributed": "ddp", "nproc_per_node": 2, "grad_accum": 4}}).train
    assert ok.grad_accum == 4
    with pytest.raises(ValueError, match="not a multiple of the world size"):
        train(MODEL, cfg(max_steps=1, grad_accum=3), synthetic_split(), None, "unused", world=World(0, 2, 0))


def test_dropout_seed_is_a_pure_function_of_seed_step_and_batch():
    assert dropout_seed(1, 5, 0) == dropout_seed(1, 5, 0)
    assert len({dropout_seed(1, 5, 0), dropout_seed(1, 5, 1), dropout_seed(1, 6, 0), dropout_seed(2, 5, 0)}) == 4
    assert 0 <= dropout_seed(-3, 1, 0) < 2**63


def test_per_step_token_count_is_the_collated_count():
    split = synthetic_split(96)
    it = EpochBatchIterator(split, max_tokens=64, data_seed=5)
    other = EpochBatchIterator(split, max_tokens=64, data_seed=5)
    for _ in range(2 * it.batches_in_epoch + 1):
        ix = it.next_indices()
        assert it.n_tgt_tokens(ix) == other.next_batch().n_tgt_tokens


# --- 2 ranks vs 1 process ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_compute_the_updates_of_one_process_with_grad_accum_2(tmp_path, mode):
    """The world-size contract: same global batches, same token normalisation, same gradients.

    A rank normalising by its own token count, or DDP's average left unscaled (a gradient
    half as large: Adam and clipping hide most of that in the weights), shows in the
    per-step gradient norm, so it is compared too.
    """
    ref, ref_steps = one_process(tmp_path, STEPS, 2, mode=mode)
    torchrun(2, tmp_path / "ddp", tmp_path / "ddp_ckpt", STEPS, 2, mode=mode)
    ddp = steps_of(tmp_path / "ddp")
    assert ddp["step"] == ref.step == STEPS
    got = {int(k): v for k, v in ddp["steps"].items()}
    assert [got[s][1] for s in range(1, STEPS + 1)] == [ref_steps[s][1] for s in range(1, STEPS + 1)]  # tokens
    for s in range(1, STEPS + 1):
        assert got[s][0] == pytest.approx(ref_steps[s][0], rel=1e-5), f"loss of step {s}"
        assert got[s][2] == pytest.approx(ref_steps[s][2], rel=1e-4), f"grad norm of step {s}"
    assert_close_weights(load_file(str(tmp_path / "ddp" / "weights.safetensors")), weights(ref.model))
    # and the check can fail: a different grad_accum is a different run
    other, _ = one_process(tmp_path, STEPS, 1, name="other", mode=mode)
    with pytest.raises(AssertionError):
        assert_close_weights(load_file(str(tmp_path / "ddp" / "weights.safetensors")), weights(other.model))


# --- exact resume ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_sigterm_to_torchrun_then_rerun_equals_the_uninterrupted_run_and_resumes_on_one_process(tmp_path, mode):
    total = 40
    torchrun(2, tmp_path / "full", tmp_path / "full_ckpt", total, 2, mode=mode)
    full = load_file(str(tmp_path / "full" / "weights.safetensors"))

    out, ckpt, hold_at = tmp_path / "cut", tmp_path / "cut_ckpt", 8
    proc = torchrun(2, out, ckpt, total, 2, hold_at=hold_at, wait=False, mode=mode)  # rank 0 waits after step 8
    deadline = time.monotonic() + 240
    done: list[str] = []
    while len(done) < hold_at and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        done = (out / "progress").read_text().split() if (out / "progress").exists() else []
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # to the launcher: torchrun passes it on to both ranks
    launcher = proc.communicate(timeout=120)[0].decode(errors="replace")
    said = f"steps done at the signal: {done}, launcher exit {proc.returncode}, its output:\n{launcher[-8000:]}"
    assert alive and len(done) == hold_at, said  # the job was held mid-run when the signal came
    assert (out / "steps.json").exists(), said  # rank 0 finished after the signal
    cut = steps_of(out)
    assert cut["stopped_by"] == "signal" and cut["step"] == hold_at, said
    state = load_checkpoint(list_checkpoints(ckpt)[-1])
    assert state.step == cut["step"] and state.extra["world_size"] == 2 and state.extra["distributed"] == mode
    per_epoch = EpochBatchIterator(synthetic_split(96), max_tokens=64, data_seed=5).batches_in_epoch
    consumed = 2 * state.step
    assert state.iterator == {"epoch": 1 + consumed // per_epoch, "iterations_in_epoch": consumed % per_epoch,
                              "data_seed": 5}
    shutil.copytree(ckpt, tmp_path / "cut_ckpt_for_one")

    torchrun(2, tmp_path / "rerun", ckpt, total, 2, mode=mode)  # the same command again
    rerun = steps_of(tmp_path / "rerun")
    assert rerun["resumed_from"] == cut["step"] and rerun["step"] == total
    assert_bitwise_equal(load_file(str(tmp_path / "rerun" / "weights.safetensors")), full)

    # The 2-rank checkpoint resumed by ONE process with the same grad_accum continues the same global order.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = train(MODEL, cfg(max_steps=total, grad_accum=2, checkpoint_every=5, keep_checkpoints=20, **LOSS_PATH[mode]),
                    synthetic_split(96), None, tmp_path / "cut_ckpt_for_one")
    finally:
        torch.set_num_threads(threads)
    assert one.resumed_from == cut["step"] and one.step == total
    assert_close_weights(weights(one.model), full)


# --- the train stage launches torchrun itself --------------------------------------------------------------


@pytest.mark.slow
def test_train_stage_with_two_ranks_interrupts_resumes_and_reports_to_mlflow(multi30k_mirror, tmp_path):
    """`aiayn train` with train.nproc_per_node 2: torchrun under the stage, SIGINT -> exit 130 with a
    checkpoint, the same command resumes, metrics reach the stage's MLflow run, the bundle is written."""
    import yaml
    from mlflow import MlflowClient

    from test_translate import REPO, aiayn, env

    params = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())
    params["train"].update(max_steps=100_000, checkpoint_every=5, keep_checkpoints=3, average_last=3, log_every=5,
                           distributed="ddp", nproc_per_node=2, grad_accum=2, validate_every=10_000)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_env = {**env(), "MLFLOW_TRACKING_URI": store, "AIAYN_DATA_MIRROR": str(multi30k_mirror)}
    common = ["--params", str(tmp_path / "params.yaml"), "--root", str(tmp_path)]
    for stage in (["fetch", "--mirror", str(multi30k_mirror), "--root", str(tmp_path)],
                  ["prepare", *common], ["tokenize", *common]):
        subprocess.run(aiayn(*stage), check=True, capture_output=True, env={**run_env, "AIAYN_TRACKING": "off"},
                       timeout=300)
    ckpts = tmp_path / "artifacts" / "checkpoints"
    proc = subprocess.Popen(aiayn("train", *common), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=run_env)
    deadline = time.monotonic() + 300
    while not list(ckpts.glob("ckpt_*.json")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    err = err.decode()
    assert proc.returncode == 130, err
    assert f"checkpoint saved in {ckpts}" in err
    cut = load_checkpoint(list_checkpoints(ckpts)[-1])
    assert cut.extra["world_size"] == 2 and cut.step >= 5

    params["train"]["max_steps"] = cut.step + 10
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    done = subprocess.run(aiayn("train", *common), capture_output=True, text=True, env=run_env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"resumed from ckpt_{cut.step:08d}" in done.stderr
    model_json = json.loads((tmp_path / "artifacts" / "model" / "model.json").read_text())
    assert model_json["step"] == cut.step + 10
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`aiayn.stage` = 'train'", order_by=["attributes.start_time DESC"])
    last = runs[0]
    assert last.info.status == "FINISHED"
    assert last.data.params["train.nproc_per_node"] == "2"
    loss_steps = [m.step for m in client.get_metric_history(last.info.run_id, "loss")]
    end = cut.step + 10
    assert loss_steps == list(range(cut.step + 5 - cut.step % 5, end + 1, 5))  # forwarded live from rank 0


def test_worker_takes_vocab_size_from_the_tokenizer_not_params_json(tmp_path, monkeypatch):
    """A hand-written params.json (multi-node) without the tokenizer's size: the worker sizes the model from
    ``artifacts/tokenized/spm.model``, as the one-process stage does (one process, no torchrun)."""
    from support import tiny
    from aiayn.stages import Layout
    from aiayn.stages.train_worker import PARAMS_FILE, RESULT_FILE, run_rank
    from aiayn.tokenizer import EncodedSplit, save_encoded

    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    layout = Layout(tmp_path)
    layout.tokenized.mkdir(parents=True)
    tok = tiny.tokenizer(tmp_path)
    (layout.tokenized / "spm.model").write_bytes(Path(tok.source).read_bytes())
    for split, (n, seed) in {"train": (48, 1), "val": (8, 2)}.items():
        en, de = tiny.corpus(n, seed)
        save_encoded(layout.tokenized, split, EncodedSplit.from_lists(tok.encode(en), tok.encode(de)))
    params = params_from_dict({
        "data": {"train_split": "train", "valid_split": "val", "test_splits": ["val"]},
        "model": {"preset": "tiny", "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 1},
        "train": {"max_steps": 2, "max_tokens": 256, "warmup_steps": 2, "checkpoint_every": 2, "validate_every": 2,
                  "num_threads": 1},
    })
    assert params.model.vocab_size != tok.vocab_size  # the preset's size: what the worker must not trust
    job = tmp_path / "job"
    job.mkdir()
    (job / PARAMS_FILE).write_text(params.model_dump_json())
    summary = run_rank(tmp_path, job)
    assert summary["step"] == 2 and json.loads((job / RESULT_FILE).read_text())["step"] == 2
    ckpt = load_checkpoint(list_checkpoints(layout.checkpoints)[-1])
    assert ckpt.model["tgt_embed.weight"].shape == (tok.vocab_size, 32)
