"""The cheaper CPU step: dropout's mask from a quarter of the random draws, rotary positions as one complex
multiply, torch's fused Adam (docs/studies/job-sizing.md, "The CPU step's form")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn.config.schema import model_preset
from aiayn.model import Transformer
from aiayn.model.dropout import Dropout, dropout, keep_mask, quantized_p
from aiayn.model.positions import RotaryPositions


def test_cpu_dropout_drops_p_of_the_elements_and_keeps_the_expectation():
    """Inverted dropout (Srivastava et al. 2014): ~p of the elements zeroed, the rest scaled by 1 / (1 - p),
    p being the requested value rounded to 1/65536 (0.05 -> 3277/65536)."""
    torch.manual_seed(0)
    n, p = 1 << 20, 0.05
    out = dropout(torch.ones(n), p, training=True)
    assert quantized_p(p) == 3277 / 65536
    dropped = float((out == 0).double().mean())
    # a binomial share: its standard deviation sd over n draws; 5 sd: a fair mask fails 1 seed in ~2 million
    # (measured here: -0.57 sd, the mean +0.57 sd, q = 0.3 / 0.5 / 0.9: -2.4 / -0.1 / -0.5 sd)
    def sd(q: float) -> float:
        return (quantized_p(q) * (1 - quantized_p(q)) / n) ** 0.5

    assert abs(dropped - quantized_p(p)) < 5 * sd(p), dropped
    assert torch.all((out == 0) | (out == torch.tensor(1 / (1 - quantized_p(p)), dtype=torch.float32)))
    assert abs(float(out.double().mean()) - 1.0) < 5 * sd(p) / (1 - p)
    for q in (0.3, 0.5, 0.9):  # the threshold's sign and offset, away from 0.05
        assert abs(float((~keep_mask((n,), q)).double().mean()) - quantized_p(q)) < 5 * sd(q), q


def test_the_mask_is_the_generator_state_and_a_quarter_of_its_draws():
    """Same state, same mask (a resumed run's saved RNG state replays it); ceil(numel / 4) int64 draws each."""
    gen = torch.Generator().manual_seed(7)
    a = keep_mask((3, 1001), 0.1, generator=gen)
    after = gen.get_state()
    b = keep_mask((3, 1001), 0.1, generator=torch.Generator().manual_seed(7))
    assert a.shape == (3, 1001) and a.dtype == torch.bool and torch.equal(a, b)
    ref = torch.Generator().manual_seed(7)
    torch.empty(-(-3003 // 4), dtype=torch.int64).random_(-(1 << 63), None, generator=ref)
    assert torch.equal(after, ref.get_state())
    assert not torch.equal(a, keep_mask((3, 1001), 0.1, generator=torch.Generator().manual_seed(8)))


def test_dropout_is_the_identity_outside_training_and_rejects_a_bad_p():
    x = torch.randn(4, 5)
    layer = Dropout(0.3).eval()
    assert layer(x) is x and dropout(x, 0.0, training=True) is x
    assert not torch.equal(layer.train()(x), x)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="dropout probability"):
            Dropout(bad)
        with pytest.raises(ValueError, match="dropout probability"):
            dropout(x, bad, training=True)


def test_the_model_drops_with_the_cheap_mask_and_replays_it_from_the_seed():
    """Every dropout of the model is ``aiayn.model.dropout.Dropout`` (torch's ``nn.Dropout`` draws 4x the
    random numbers on CPU); a training forward is a function of the seed."""
    cfg = model_preset("tiny", vocab_size=50, d_model=32, n_heads=2, d_ff=64, n_layers=1, dropout=0.2,
                       positions="rope", norm="pre")
    model = Transformer(cfg).train()
    assert not any(type(m) is nn.Dropout for m in model.modules())
    assert sum(isinstance(m, Dropout) for m in model.modules()) >= 3
    src, tgt = torch.randint(4, 50, (3, 9)), torch.randint(4, 50, (3, 7))
    torch.manual_seed(3)
    a = model(src, tgt)
    torch.manual_seed(3)
    assert torch.equal(a, model(src, tgt))
    assert not torch.equal(a, model(src, tgt))  # the generator moved on: another mask
    assert torch.equal(model.eval()(src, tgt), model(src, tgt))


def _rotate_real(rope: RotaryPositions, x: torch.Tensor, start: int) -> torch.Tensor:
    """RoFormer eq. 34 in its real form: pair (2i, 2i+1) -> (e cos - o sin, e sin + o cos)."""
    cos, sin = rope.cos[start : start + x.shape[-2]], rope.sin[start : start + x.shape[-2]]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


@pytest.mark.parametrize("head_dim", [64, 32, 6])
def test_rotary_positions_as_one_complex_multiply_are_the_real_rotation(head_dim):
    """The complex form computes the same products and differences: the same bytes, forward and backward,
    wherever the vector kernels cover a row (head_dim a multiple of 16: the presets' 64 and 32); a scalar tail may
    fuse a multiply-add (within 1 ulp). Per-row positions and bf16 (the real form) agree too."""
    gen = torch.Generator().manual_seed(head_dim)
    rope = RotaryPositions(head_dim=head_dim, max_positions=64)
    x = torch.randn(2, 9, 3, head_dim, generator=gen).transpose(1, 2).requires_grad_()  # (B, H, T, D), strided
    grad = torch.randn(2, 3, 9, head_dim, generator=gen)
    ours, real = rope.rotate(x, 5), _rotate_real(rope, x, 5)
    (g_ours,), (g_real,) = torch.autograd.grad(ours, x, grad), torch.autograd.grad(real, x, grad)
    if head_dim % 16 == 0:
        assert torch.equal(ours, real) and torch.equal(g_ours, g_real)
    # one fused multiply-add against a multiply and an add: at most 1 ulp of a product plus half an ulp of the
    # result; products and results here are below 8 in magnitude (inputs and gradients: pair norms <= 4.1),
    # 1.5 ulp = 7.2e-7 < 1e-6. Measured 2.4e-7 forward, 1.2e-7 backward (head_dim 6's scalar tail)
    torch.testing.assert_close(ours, real, rtol=0, atol=1e-6)
    torch.testing.assert_close(g_ours, g_real, rtol=0, atol=1e-6)
    rows = torch.arange(5, 14).expand(2, 9)  # per-row positions (the decoder-only stream)
    torch.testing.assert_close(rope.rotate(x, rows), ours, rtol=0, atol=0)
    half = rope.rotate(x.detach().bfloat16(), 5)
    assert half.dtype == torch.bfloat16
    # bf16 rounds to 8 significant bits (half an ulp: 2^-9 relative) the input, the cos/sin tables, each product
    # and the difference: at most 2^-9 (3 (|e cos| + |o sin|) + |result|) <= 2^-9 (3 sqrt(2) + 1) r for a
    # pair of norm r; r <= 4.1 here: 0.042 < 0.05. Measured 0.020 (head_dim 64)
    torch.testing.assert_close(half.float(), real.detach(), rtol=0, atol=0.05)


def test_the_trainer_steps_adam_with_torchs_fused_kernel(tmp_path):
    """One pass per parameter (``fused=True``) outside FSDP, whose DTensor shards keep the per-tensor loop."""
    from aiayn.config.schema import TrainConfig
    from aiayn.tokenizer import EncodedSplit
    from aiayn.train.trainer import Trainer

    split = EncodedSplit.from_lists([[5, 6, 7, 3]] * 4, [[8, 9, 3]] * 4)
    cfg = model_preset("tiny", vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_layers=1)
    trainer = Trainer(cfg, TrainConfig(max_steps=1, max_tokens=64), split, split, tmp_path)
    trainer.setup(resume=False)
    assert trainer.optimizer.defaults["fused"] is True


def test_a_p_the_mask_cannot_apply_is_refused():
    """Below 2**-17 the mask would drop nothing, within 2**-17 of 1 everything (and divide by zero)."""
    for bad in (1e-6, 1 - 1e-6):
        with pytest.raises(ValueError, match="resolution"):
            Dropout(bad)
    assert quantized_p(2**-16) == 2**-16 and quantized_p(1 - 2**-16) == 1 - 2**-16


def test_compiled_code_and_odd_layouts_keep_the_plain_forms(monkeypatch):
    """Under torch.compile dropout is torch's (inductor draws its own masks) and rotary positions take the real
    form; a layout view_as_complex cannot take (an odd storage offset) takes the real form too, same values."""
    import aiayn.model.dropout as mod

    x = torch.ones(4, 6)
    calls = []
    monkeypatch.setattr(mod.F, "dropout", lambda t, p, training: calls.append(p) or t)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert dropout(x, 0.25, training=True) is x and calls == [0.25]
    rope = RotaryPositions(head_dim=8, max_positions=16)
    y = torch.randn(2, 3, 5, 8)
    assert torch.equal(rope.rotate(y, 2), _rotate_real(rope, y, 2))
    monkeypatch.undo()
    odd = torch.randn(2, 3, 5, 9)[..., 1:]  # storage offset 1, strides 135 / 45 / 9
    assert torch.equal(rope.rotate(odd, 2), _rotate_real(rope, odd, 2))


def _old_adam(trainer) -> None:
    """The optimizer as written before the fused kernel (what an older checkpoint's param groups carry)."""
    trainer.optimizer = torch.optim.Adam(trainer.model.parameters(), lr=trainer._lr(1), betas=trainer.cfg.adam_betas,
                                         eps=trainer.cfg.adam_eps, weight_decay=trainer.cfg.weight_decay)


def test_a_resumed_run_steps_with_the_fused_kernel_whatever_wrote_its_checkpoint(tmp_path, monkeypatch):
    """torch's load_state_dict takes each group's settings from the checkpoint, ``fused`` included: a run
    resumed from a checkpoint of the per-tensor loop (or of FSDP's ranks) would keep that loop."""
    from aiayn.config.schema import TrainConfig
    from aiayn.tokenizer import EncodedSplit
    from aiayn.train.trainer import Trainer

    split = EncodedSplit.from_lists([[5, 6, 7, 3]] * 8, [[8, 9, 3]] * 8)
    cfg = model_preset("tiny", vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_layers=1)
    with monkeypatch.context() as m:
        m.setattr(Trainer, "_setup_optimizer", _old_adam)
        first = Trainer(cfg, TrainConfig(max_steps=2, max_tokens=64, warmup_steps=1), split, None, tmp_path)
        first.setup()
        first.train()
        assert not first.optimizer.param_groups[0]["fused"]
    second = Trainer(cfg, TrainConfig(max_steps=4, max_tokens=64, warmup_steps=1), split, None, tmp_path)
    second.setup()
    assert second.result.resumed_from == 2
    assert all(g["fused"] is True for g in second.optimizer.param_groups)


def test_a_checkpoint_of_another_step_arithmetic_is_not_resumed(monkeypatch):
    """The fingerprint holds ``STEP_ARITHMETIC``: a checkpoint written by the old step (torch's mask, Adam's loop)
    starts a fresh run instead of mixing two float orders in one model. Budgets stay out of it (a raised
    ``max_steps`` continues a run, README)."""
    from aiayn.config.schema import TrainConfig
    from aiayn.train import trainer as tr

    cfg = model_preset("tiny", vocab_size=16)
    fp = lambda **kw: tr.config_fingerprint(cfg, TrainConfig(warmup_steps=500, **kw), "data")  # noqa: E731
    before = fp(lr_decay="linear", max_steps=1900)
    assert fp(lr_decay="linear", max_steps=2000) == before
    monkeypatch.setattr(tr, "STEP_ARITHMETIC", tr.STEP_ARITHMETIC + 1)
    assert fp(lr_decay="linear", max_steps=1900) != before
