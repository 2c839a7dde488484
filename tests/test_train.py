"""Training core: loss, schedule, seeded order, bitwise reproducibility, exact resume, checkpoint integrity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aiayn.data.batching import EpochBatchIterator, make_batches
from aiayn.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from aiayn.config.schema import PAD_ID, ModelConfig, TrainConfig
from aiayn.tokenizer import EncodedSplit
from aiayn.train import (
    inverse_sqrt_lr,
    label_smoothed_cross_entropy,
    learning_rate,
    linear_label_smoothed_cross_entropy,
    train,
)

VOCAB = 40
MODEL = ModelConfig(vocab_size=VOCAB, d_model=32, n_heads=2, d_ff=64, n_layers=1, dropout=0.1, attention_backend="sdpa")


def synthetic_split(n: int = 48, seed: int = 0) -> EncodedSplit:
    """Random pairs (lengths 2..10, ids 4..VOCAB-1: no special ids) with a learnable mapping."""
    rng = np.random.default_rng(seed)
    src, tgt = [], []
    for _ in range(n):
        s = rng.integers(4, VOCAB, size=int(rng.integers(2, 11)))
        src.append(s)
        tgt.append(((s * 7) % (VOCAB - 4) + 4)[: max(1, len(s) - int(rng.integers(0, 2)))])

    def pack(seqs):
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(x) for x in seqs])
        return np.concatenate(seqs).astype(np.int32), offsets

    s_ids, s_off = pack(src)
    t_ids, t_off = pack(tgt)
    return EncodedSplit(src_ids=s_ids, src_offsets=s_off, tgt_ids=t_ids, tgt_offsets=t_off)


def cfg(**kw) -> TrainConfig:
    base = dict(seed=3, data_seed=5, max_steps=12, max_tokens=64, warmup_steps=4, lr_scale=2.0, validate_every=1000,
                checkpoint_every=1000, keep_checkpoints=3, average_last=2, log_every=1)
    return TrainConfig(**(base | kw))


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs (max |diff| {(a[k] - b[k]).abs().max().item():.3g})"


# --- loss and schedule -------------------------------------------------------------------------------------


def test_label_smoothed_loss_matches_formula_and_ignores_pad():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    target = torch.tensor([[4, 5, 6, PAD_ID, PAD_ID], [7, 8, 9, 10, 3]])
    eps = 0.1
    loss, nll, n = label_smoothed_cross_entropy(logits, target, label_smoothing=eps)
    lprobs = torch.log_softmax(logits.double(), -1)
    mask = target != PAD_ID
    want_nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].sum()
    want = (1 - eps) * want_nll + eps * (-lprobs.mean(-1))[mask].sum()
    assert n == 8
    assert math.isclose(float(nll), float(want_nll), rel_tol=1e-5)
    assert math.isclose(float(loss), float(want), rel_tol=1e-5)


def test_appending_pad_tokens_leaves_loss_unchanged():
    """Extra PAD columns (and a PAD-only row) change neither loss nor token count."""
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 9)
    target = torch.tensor([[4, 5, 6, 3], [7, 3, PAD_ID, PAD_ID]])
    padded_logits = torch.cat([logits, torch.randn(2, 3, 9)], dim=1)
    padded_target = torch.cat([target, torch.full((2, 3), PAD_ID)], dim=1)
    padded_logits = torch.cat([padded_logits, torch.randn(1, 7, 9)], dim=0)
    padded_target = torch.cat([padded_target, torch.full((1, 7), PAD_ID)], dim=0)
    a = label_smoothed_cross_entropy(logits, target, label_smoothing=0.1)
    b = label_smoothed_cross_entropy(padded_logits, padded_target, label_smoothing=0.1)
    assert a[2] == b[2] == 6
    assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_tokens", [1, 3, 512])
def test_chunked_linear_loss_equals_logits_then_loss_with_its_gradients(eps, chunk_tokens):
    """The fused output projection + loss: the same loss, NLL, count and gradients (hidden and the tied
    weight) as projecting to (B, T, V) logits and taking label_smoothed_cross_entropy, pads ignored."""
    torch.manual_seed(2)
    hidden = torch.randn(3, 6, 8, requires_grad=True)
    weight = torch.randn(13, 8, requires_grad=True)
    target = torch.tensor([[4, 5, 6, 3, PAD_ID, PAD_ID], [7, 8, 9, 10, 11, 3], [PAD_ID] * 6])
    want = label_smoothed_cross_entropy(hidden @ weight.T, target, label_smoothing=eps)
    (want[0] * 0.3).backward()
    want_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    got = linear_label_smoothed_cross_entropy(hidden, weight, target, label_smoothing=eps, chunk_tokens=chunk_tokens)
    (got[0] * 0.3).backward()
    assert got[2] == want[2] == 10
    assert torch.allclose(got[0], want[0], rtol=1e-5) and torch.allclose(got[1], want[1], rtol=1e-5)
    assert not got[1].requires_grad
    assert torch.allclose(hidden.grad, want_grads[0], atol=1e-6) and torch.allclose(weight.grad, want_grads[1], atol=1e-6)
    assert hidden.grad[2].abs().sum() == 0  # the all-pad row gets no gradient


def test_chunked_linear_loss_refuses_what_it_cannot_do():
    h, w, t = torch.randn(2, 3, 4), torch.randn(9, 4), torch.tensor([[4, 5, 3], [6, 3, PAD_ID]])
    with pytest.raises(ValueError, match="float32 or float64"):
        linear_label_smoothed_cross_entropy(h.bfloat16(), w, t, label_smoothing=0.1)
    with pytest.raises(ValueError, match="float32 or float64"):
        linear_label_smoothed_cross_entropy(h.double(), w, t, label_smoothing=0.1)  # mixed
    want = label_smoothed_cross_entropy(h.double() @ w.double().T, t, label_smoothing=0.1)
    got = linear_label_smoothed_cross_entropy(h.double(), w.double(), t, label_smoothing=0.1)  # float64 runs too
    assert got[0].dtype == torch.float64 and torch.allclose(got[0], want[0], rtol=1e-12)
    with pytest.raises(ValueError, match="chunk_tokens"):
        linear_label_smoothed_cross_entropy(h, w, t, label_smoothing=0.1, chunk_tokens=0)


def test_training_with_the_chunked_loss_follows_the_plain_path(tmp_path):
    """Same seeds, same batches: the fused loss (the default) and the plain logits path train to the same
    weights up to float32 rounding (not bit for bit: another summation order)."""
    split = synthetic_split()
    fused = train(MODEL, cfg(max_steps=3), split, None, tmp_path / "fused")
    plain = train(MODEL, cfg(max_steps=3, loss_chunk_tokens=None), split, None, tmp_path / "plain")
    assert fused.losses.keys() == plain.losses.keys() == {1, 2, 3}
    assert all(abs(fused.losses[k] - plain.losses[k]) < 1e-4 for k in fused.losses)
    for (name, a), (_, b) in zip(weights(fused.model).items(), weights(plain.model).items()):
        if name.endswith("k_proj.bias"):  # a key bias shifts every score of a query alike: its gradient is 0 up to
            continue  # rounding, which Adam's normalisation blows up to lr-sized steps on either path
        assert torch.allclose(a, b, atol=1e-4), name


def test_linear_decay_shares_the_warmup_and_peak_then_anneals_to_zero_at_max_steps():
    kw = dict(d_model=256, warmup_steps=100, lr_scale=2.0)
    for step in (1, 50, 100):  # the warmup is eq. (3)'s
        assert math.isclose(learning_rate(step, decay="linear", max_steps=500, **kw), inverse_sqrt_lr(step, **kw))
    peak = inverse_sqrt_lr(100, **kw)
    assert math.isclose(learning_rate(300, decay="linear", max_steps=500, **kw), peak * 201 / 401)
    assert learning_rate(500, decay="linear", max_steps=500, **kw) > 0  # the last update still learns
    assert learning_rate(501, decay="linear", max_steps=500, **kw) == 0.0
    assert learning_rate(300, max_steps=500, **kw) == inverse_sqrt_lr(300, **kw)  # the default is the paper's
    with pytest.raises(ValueError, match="max_steps"):
        learning_rate(10, decay="linear", max_steps=100, **kw)
    with pytest.raises(ValueError, match="unknown lr decay"):
        learning_rate(10, decay="cosine", max_steps=500, **kw)
    with pytest.raises(ValueError, match="lr_decay=linear"):
        TrainConfig(lr_decay="linear", max_steps=100, warmup_steps=100)


def test_the_trainer_follows_the_configured_lr_decay(tmp_path):
    logged: list[tuple[int, dict]] = []
    train(MODEL, cfg(max_steps=6, lr_decay="linear"), synthetic_split(), None, tmp_path,
          on_metrics=lambda m, s: logged.append((s, m)))
    lrs = {s: m["lr"] for s, m in logged if "lr" in m}
    want = {s: learning_rate(s, d_model=MODEL.d_model, warmup_steps=4, lr_scale=2.0, decay="linear", max_steps=6)
            for s in range(1, 7)}
    assert lrs.keys() == want.keys() and all(math.isclose(lrs[s], want[s], rel_tol=1e-6) for s in want)


def test_inverse_sqrt_schedule_is_paper_eq3():
    d, w = 512, 4000
    assert math.isclose(inverse_sqrt_lr(w, d_model=d, warmup_steps=w), d**-0.5 * w**-0.5)
    assert math.isclose(inverse_sqrt_lr(100, d_model=d, warmup_steps=w), d**-0.5 * 100 * w**-1.5)
    assert math.isclose(inverse_sqrt_lr(16000, d_model=d, warmup_steps=w), d**-0.5 * 16000**-0.5)
    peak = max(range(1, 20000, 7), key=lambda s: inverse_sqrt_lr(s, d_model=d, warmup_steps=w))
    assert abs(peak - w) <= 7


# --- data order ------------------------------------------------------------------------------------------


def test_batches_respect_max_tokens_and_cover_every_pair_once():
    split = synthetic_split(100)
    batches = make_batches(split.src_lengths, split.tgt_lengths, 50, data_seed=1, epoch=1)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(100))
    for b in batches:
        width = int(np.maximum(split.src_lengths[b], split.tgt_lengths[b]).max()) + 1
        assert len(b) * width <= 50


def test_order_is_pure_function_of_seed_and_epoch():
    split = synthetic_split(100)
    args = (split.src_lengths, split.tgt_lengths, 50)
    same = [make_batches(*args, data_seed=1, epoch=2) for _ in range(2)]
    assert all(np.array_equal(x, y) for x, y in zip(*same))
    other_epoch = make_batches(*args, data_seed=1, epoch=3)
    other_seed = make_batches(*args, data_seed=2, epoch=2)
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(same[0], other_epoch))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(same[0], other_seed))


def test_iterator_state_fast_forwards_to_the_same_batch():
    split = synthetic_split(60)
    it = EpochBatchIterator(split, max_tokens=64, data_seed=9)
    stream = [it.next_batch().indices for _ in range(25)]  # crosses at least one epoch boundary
    assert it.epoch >= 2
    for k in (0, 7, 13, 24):
        it2 = EpochBatchIterator(split, max_tokens=64, data_seed=9)
        for _ in range(k):
            it2.next_batch()
        it3 = EpochBatchIterator(split, max_tokens=64, data_seed=9)
        it3.load_state_dict(it2.state_dict())
        assert np.array_equal(it3.next_batch().indices, stream[k])


def test_oversized_pair_is_rejected_with_its_index():
    split = synthetic_split(10)
    with pytest.raises(ValueError, match="more than max_tokens=5"):
        make_batches(split.src_lengths, split.tgt_lengths, 5, data_seed=1, epoch=1)


# --- reproducibility and resume ------------------------------------------------------------------------------


def test_same_seeds_give_bitwise_identical_weights(tmp_path):
    split = synthetic_split()
    a = train(MODEL, cfg(), split, None, tmp_path / "a")
    b = train(MODEL, cfg(), split, None, tmp_path / "b")
    assert a.step == b.step == 12
    assert a.losses == b.losses
    assert_bitwise_equal(weights(a.model), weights(b.model))
    c = train(MODEL, cfg(seed=4), split, None, tmp_path / "c")
    assert any(not torch.equal(x, y) for x, y in zip(weights(a.model).values(), weights(c.model).values()))


def test_data_seed_changes_order_but_not_initial_weights(tmp_path):
    split = synthetic_split()
    a = train(MODEL, cfg(max_steps=0), split, None, tmp_path / "a")
    b = train(MODEL, cfg(max_steps=0, data_seed=6), split, None, tmp_path / "b")
    assert_bitwise_equal(weights(a.model), weights(b.model))
    it_a = EpochBatchIterator(split, max_tokens=64, data_seed=5)
    it_b = EpochBatchIterator(split, max_tokens=64, data_seed=6)
    order_a = [it_a.next_batch().indices.tolist() for _ in range(it_a.batches_in_epoch)]
    order_b = [it_b.next_batch().indices.tolist() for _ in range(it_b.batches_in_epoch)]
    assert order_a != order_b
    la = train(MODEL, cfg(max_steps=3), split, None, tmp_path / "la").losses
    lb = train(MODEL, cfg(max_steps=3, data_seed=6), split, None, tmp_path / "lb").losses
    assert la != lb


@pytest.mark.parametrize("where", ["mid_epoch", "epoch_boundary"])
def test_resume_is_bitwise_identical_to_uninterrupted_run(tmp_path, where):
    split = synthetic_split()
    per_epoch = EpochBatchIterator(split, max_tokens=64, data_seed=5).batches_in_epoch
    k = per_epoch // 2 if where == "mid_epoch" else per_epoch
    total = per_epoch + 4
    full = train(MODEL, cfg(max_steps=total), split, None, tmp_path / "full")

    first = train(MODEL, cfg(max_steps=k), split, None, tmp_path / "resumed")
    assert first.step == k
    state = load_checkpoint(list_checkpoints(tmp_path / "resumed")[-1])
    expect_iter = (1, k) if where == "mid_epoch" else (1, per_epoch)
    assert (state.iterator["epoch"], state.iterator["iterations_in_epoch"]) == expect_iter
    torch.manual_seed(12345)  # a resumed process starts with unrelated RNG state
    second = train(MODEL, cfg(max_steps=total), split, None, tmp_path / "resumed")
    assert second.resumed_from == k
    assert second.losses == full.losses  # every per-step loss, before and after the stop
    assert_bitwise_equal(weights(second.model), weights(full.model))


def test_changed_config_does_not_resume_foreign_checkpoints(tmp_path, caplog):
    split = synthetic_split()
    train(MODEL, cfg(max_steps=3), split, None, tmp_path / "ck")
    other = train(MODEL, cfg(max_steps=3, lr_scale=1.0), split, None, tmp_path / "ck")
    assert other.resumed_from is None
    assert "different config" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "tamper", "drop_json_field"])
def test_damaged_checkpoint_is_refused(tmp_path, damage):
    split = synthetic_split()
    train(MODEL, cfg(max_steps=2), split, None, tmp_path / "ck")
    json_path = list_checkpoints(tmp_path / "ck")[-1]
    tensors = json_path.with_suffix(".safetensors")
    if damage == "truncate":
        tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
    elif damage == "tamper":
        data = bytearray(tensors.read_bytes())
        data[-10] ^= 0xFF
        tensors.write_bytes(bytes(data))
    else:
        json_path.write_text(json_path.read_text().replace('"format"', '"formatx"'))
    with pytest.raises(CheckpointError):
        load_checkpoint(json_path)
    with pytest.raises(CheckpointError):
        train(MODEL, cfg(max_steps=4), split, None, tmp_path / "ck")


def test_training_reduces_loss(tmp_path):
    split = synthetic_split()
    res = train(MODEL, cfg(max_steps=40), split, split, tmp_path / "ck")
    first = np.mean([res.losses[s] for s in range(1, 6)])
    last = np.mean([res.losses[s] for s in range(36, 41)])
    assert last < first - 0.3


def test_grad_accum_takes_several_batches_per_update(tmp_path):
    split = synthetic_split()
    per_epoch = EpochBatchIterator(split, max_tokens=64, data_seed=5).batches_in_epoch
    res = train(MODEL, cfg(max_steps=per_epoch // 2 + 1, grad_accum=2), split, None, tmp_path / "ck")
    state = load_checkpoint(list_checkpoints(tmp_path / "ck")[-1])
    # (per_epoch // 2 + 1) updates x 2 batches = one epoch and 1-2 batches of the next
    consumed = (state.iterator["epoch"] - 1) * per_epoch + state.iterator["iterations_in_epoch"]
    assert consumed == 2 * res.step


def test_checkpoint_averaging_is_the_elementwise_mean(tmp_path):
    from aiayn.checkpoint import average_checkpoints
    from aiayn.train import averaged_weights

    split = synthetic_split()
    train(MODEL, cfg(max_steps=6, checkpoint_every=2, keep_checkpoints=3), split, None, tmp_path / "ck")
    paths = list_checkpoints(tmp_path / "ck")
    assert [p.name for p in paths] == ["ckpt_00000002.json", "ckpt_00000004.json", "ckpt_00000006.json"]
    states = [load_checkpoint(p).model for p in paths[-2:]]
    avg, steps = averaged_weights(tmp_path / "ck", 2)
    assert steps == [4, 6]
    for k in avg:
        want = (states[0][k].double() + states[1][k].double()) / 2
        assert torch.allclose(avg[k].double(), want, atol=1e-7), k
    assert any(not torch.equal(states[0][k], states[1][k]) for k in avg)  # the mean is not a copy
    with pytest.raises(CheckpointError, match="no checkpoints"):
        average_checkpoints([])


def test_averaging_uses_evenly_spaced_checkpoints_after_an_off_grid_stop(tmp_path):
    """A run cut off the checkpoint grid (step 7 with checkpoint_every=2) averages steps 2, 4, 6, never 6 and 7."""
    from aiayn.train import averaged_weights

    split = synthetic_split()
    train(MODEL, cfg(max_steps=7, checkpoint_every=2, keep_checkpoints=3), split, None, tmp_path / "ck")
    names = [p.name for p in list_checkpoints(tmp_path / "ck")]
    assert names == ["ckpt_00000002.json", "ckpt_00000004.json", "ckpt_00000006.json", "ckpt_00000007.json"]
    _, steps = averaged_weights(tmp_path / "ck", 3, every=2)
    assert steps == [2, 4, 6]
    _, steps = averaged_weights(tmp_path / "ck", 3, every=100)  # nothing on the grid: the newest alone
    assert steps == [7]


def test_trainer_driven_step_by_step_is_the_train_function(tmp_path):
    """``Trainer``'s parts called by hand (setup, step while should_stop is None, checkpoint) make train()'s run."""
    from aiayn.train import Trainer

    split, valid = synthetic_split(), synthetic_split(8, seed=1)
    full = train(MODEL, cfg(max_steps=5, validate_every=2), split, valid, tmp_path / "full")
    trainer = Trainer(MODEL, cfg(max_steps=5, validate_every=2), split, valid, tmp_path / "manual")
    trainer.setup()
    steps = 0
    while (reason := trainer.should_stop()) is None:
        trainer.step()
        steps += 1
    trainer.checkpoint()
    assert (reason, steps, full.stopped_by) == ("max_steps", 5, "max_steps")
    assert trainer.result.losses == full.losses and trainer.result.valid == full.valid and sorted(full.valid) == [2, 4]
    assert_bitwise_equal(weights(trainer.result.model), weights(full.model))
    [a], [b] = list_checkpoints(tmp_path / "full"), list_checkpoints(tmp_path / "manual")
    assert a.name == b.name == "ckpt_00000005.json"
    assert a.with_suffix(".safetensors").read_bytes() == b.with_suffix(".safetensors").read_bytes()


def test_checkpoint_step_reads_the_names_list_checkpoints_finds(tmp_path):
    from aiayn.checkpoint import checkpoint_step

    train(MODEL, cfg(max_steps=3, checkpoint_every=2), synthetic_split(), None, tmp_path / "ck")
    assert [checkpoint_step(p) for p in list_checkpoints(tmp_path / "ck")] == [2, 3]
    with pytest.raises(ValueError, match="not a checkpoint name"):
        checkpoint_step(tmp_path / "ck" / "ckpt_2.json")


# --- the GPU path's guards, checked on CPU ---------------------------------------------------------------------


def test_non_finite_updates_are_skipped_counted_and_logged_then_raise(tmp_path, monkeypatch):
    import aiayn.train.trainer as train_module  # the loop's module: where it looks the loss up

    real = train_module.linear_label_smoothed_cross_entropy  # the default (fused) loss
    poisoned = {3, 4}  # optimizer updates whose loss is made non-finite
    calls = {"n": 0}

    def spiky(*args, **kw):
        calls["n"] += 1  # one call per batch; grad_accum 1: call n is update n
        loss, nll, n = real(*args, **kw)
        return (loss * float("inf") if calls["n"] in poisoned else loss), nll, n

    split = synthetic_split()
    clean = train(MODEL, cfg(max_steps=2), split, None, tmp_path / "clean")
    monkeypatch.setattr(train_module, "linear_label_smoothed_cross_entropy", spiky)
    logged: list[tuple[int, dict]] = []
    res = train(MODEL, cfg(max_steps=4), split, None, tmp_path / "spiky", on_metrics=lambda m, s: logged.append((s, m)))
    assert res.step == 4 and res.skipped_updates == 2
    assert_bitwise_equal(weights(res.model), weights(clean.model))  # steps 3 and 4 changed nothing
    assert [(s, m["skipped_updates"]) for s, m in logged if "skipped_updates" in m] == [(3, 1.0), (4, 2.0)]
    assert load_checkpoint(list_checkpoints(tmp_path / "spiky")[-1]).extra["skipped_updates"] == 2

    calls["n"] = 0
    poisoned.update(range(3, 100))
    with pytest.raises(FloatingPointError, match="3 consecutive updates"):
        train(MODEL, cfg(max_steps=20, max_skipped_updates=2), split, None, tmp_path / "exploding")


def test_bf16_autocast_trains_on_cpu_and_fp16_needs_cuda(tmp_path):
    split = synthetic_split()
    fp32 = train(MODEL, cfg(max_steps=6), split, None, tmp_path / "fp32")
    bf16 = train(MODEL, cfg(max_steps=6, precision="bf16"), split, None, tmp_path / "bf16")
    assert all(math.isfinite(v) for v in bf16.losses.values())
    # same weights, bf16 rounding only: measured |4.2972 - 4.2967| = 5.1e-4 here. bf16 keeps 8 significant bits
    # (2^-9 = 0.2 % relative rounding); 0.2 % of this loss (4.3) is 0.0084: bound 0.01 (was 0.05)
    assert bf16.losses[1] == pytest.approx(fp32.losses[1], abs=0.01)
    assert bf16.losses != fp32.losses  # autocast really ran in bf16
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16 needs CUDA"):
            train(MODEL, cfg(max_steps=1, precision="fp16", device="cpu"), split, None, tmp_path / "fp16")


@pytest.mark.slow
def test_compiled_training_matches_eager_without_dropout(tmp_path):
    """train.compile: Inductor's graph computes the eager updates (dropout off: compiled dropout
    draws its masks from Inductor's own seeded generator, not eager's stream).

    Both runs train in float64, which is what lets one tolerance hold on every CPU. Inductor sums
    in another order than eager, and which order depends on the vector ISA it generates code for
    (AVX2 vs AVX-512), so float32 runs differ by rounding noise (~1e-7 relative) that Adam turns
    into lr-sized steps of either sign wherever a gradient is zero in exact arithmetic (key biases:
    softmax ignores a shift shared by all keys) or a ReLU input sits within the noise of 0: on an
    AVX2-only host ``ffn.w1`` moved by ~lr after 4 steps. In float64 the gradient noise is
    ~1e-16 relative (|g| <= 1 here, a few hundred terms per sum: |dg| <= 1e-15 absolute), and
    Adam's step ``lr * m / (sqrt(v) + eps)`` moves by at most ``lr / eps`` per unit of gradient
    change (its slope at g = 0), so 4 steps at lr <= 0.18 (warmup 4, lr_scale 2, d_model 32) and
    eps 1e-9 differ by at most 4 * 0.18 / 1e-9 * 1e-15 = 7.2e-7 in any weight: ATOL below. A
    wrong compiled op moves weights by ~lr (0.18) and losses in the 3rd digit.
    """
    ATOL = 1e-6  # the bound above, rounded up
    split = synthetic_split()
    model = MODEL.model_copy(update={"dropout": 0.0})
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        eager = train(model, cfg(max_steps=4), split, None, tmp_path / "eager")
        compiled = train(model, cfg(max_steps=4, compile=True), split, None, tmp_path / "compiled")
    finally:
        torch.set_default_dtype(dtype)
    assert all(v.dtype == torch.float64 for v in eager.model.parameters())
    for s in range(1, 5):
        assert compiled.losses[s] == pytest.approx(eager.losses[s], rel=1e-12)
    differ = {k: float((v - weights(eager.model)[k]).abs().max()) for k, v in weights(compiled.model).items()
              if not torch.allclose(v, weights(eager.model)[k], rtol=0, atol=ATOL)}
    assert not differ, differ


def test_the_plotted_lr_is_the_lr_the_optimizer_used(tmp_path):
    """``plots/train_loss.tsv``'s lr column (the curve ``dvc plots show`` draws) is the optimizer's learning rate
    whatever the schedule: it drew the paper's inverse-sqrt curve for every run, so the main job's linear decay
    showed 1.43e-3 at its last step, where the optimizer used 2.0e-6."""
    from types import SimpleNamespace

    from aiayn.stages import Layout
    from aiayn.stages.train import _write_plots

    used: dict[int, float] = {}
    c = cfg(lr_decay="linear")
    result = train(MODEL, c, synthetic_split(), None, tmp_path / "ckpt",
                   on_metrics=lambda m, step: used.update({step: m["lr"]}))
    layout = Layout(tmp_path)
    _write_plots(layout, result, {}, SimpleNamespace(train=c, model=MODEL))
    rows = [line.split("\t") for line in (layout.plots / "train_loss.tsv").read_text().splitlines()[1:]]
    assert [int(step) for step, _, _ in rows] == sorted(used) == list(range(1, c.max_steps + 1))
    for step, _, lr in rows:
        assert math.isclose(float(lr), used[int(step)], rel_tol=1e-6), step
    assert float(rows[-1][2]) < 0.2 * max(used.values())  # annealed: not the inverse-sqrt tail
