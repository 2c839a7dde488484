"""The cheaper CPU step: dropout's mask from a quarter of the random draws, rotary positions as one complex
multiply, torch's fused Adam (docs/benchmarks.md, "A cheaper CPU step")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn.config import model_preset
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
    sd = (quantized_p(p) * (1 - quantized_p(p)) / n) ** 0.5
    assert abs(dropped - quantized_p(p)) < 5 * sd, dropped
    assert torch.all((out == 0) | (out == torch.tensor(1 / (1 - quantized_p(p)), dtype=torch.float32)))
    assert abs(float(out.double().mean()) - 1.0) < 5 * sd / (1 - p)
    for q in (0.3, 0.5, 0.9):  # the threshold's sign and offset, away from 0.05
        assert abs(float((~keep_mask((n,), q)).double().mean()) - quantized_p(q)) < 0.003, q


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
    torch.testing.assert_close(ours, real, rtol=0, atol=1e-6)
    torch.testing.assert_close(g_ours, g_real, rtol=0, atol=1e-6)
    rows = torch.arange(5, 14).expand(2, 9)  # per-row positions (the decoder-only stream)
    torch.testing.assert_close(rope.rotate(x, rows), ours, rtol=0, atol=0)
    half = rope.rotate(x.detach().bfloat16(), 5)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), real.detach(), rtol=0.02, atol=0.05)


def test_the_trainer_steps_adam_with_torchs_fused_kernel(tmp_path):
    """One pass per parameter (``fused=True``) outside FSDP, whose DTensor shards keep the per-tensor loop."""
    from aiayn.config import TrainConfig
    from aiayn.tokenizer import EncodedSplit
    from aiayn.train.trainer import Trainer

    split = EncodedSplit.from_lists([[5, 6, 7, 3]] * 4, [[8, 9, 3]] * 4)
    cfg = model_preset("tiny", vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_layers=1)
    trainer = Trainer(cfg, TrainConfig(max_steps=1, max_tokens=64), split, split, tmp_path)
    trainer.setup(resume=False)
    assert trainer.optimizer.defaults["fused"] is True
