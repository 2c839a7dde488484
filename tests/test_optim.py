"""``train.optimizer``: the paper's Adam, or Muon for the layers' weight matrices (aiayn.train.optim)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.config.schema import TrainConfig, model_preset
from aiayn.model import Transformer
from aiayn.train import train
from aiayn.train.optim import NS_COEFFICIENTS, FP32Muon, MuonWithAdam, build_optimizer, muon_parameter
from aiayn.train.trainer import config_fingerprint
from test_train import MODEL, assert_bitwise_equal, cfg, synthetic_split, weights


def test_muon_takes_the_layers_matrices_and_adam_the_embeddings_biases_and_norms():
    model = Transformer(MODEL)
    opt = build_optimizer(model, cfg(optimizer="muon"), lr=1e-3, fused=True)
    assert isinstance(opt, MuonWithAdam)
    muon_ids = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        expect = p.ndim == 2 and name.startswith(("encoder_layers.", "decoder_layers."))
        assert (id(p) in muon_ids) == expect == muon_parameter(name, p), name
    assert {id(p) for g in opt.adam.param_groups for p in g["params"]} == \
        {id(p) for _, p in model.named_parameters()} - muon_ids


def test_muon_training_lowers_the_loss(tmp_path):
    split = synthetic_split()
    res = train(MODEL, cfg(max_steps=40, optimizer="muon"), split, split, tmp_path / "ck")
    first = sum(res.losses[s] for s in range(1, 6)) / 5
    last = sum(res.losses[s] for s in range(36, 41)) / 5
    # measured 4.03 -> 3.64 (a 0.39 drop) over these 40 steps; bound: three quarters of it
    assert last < first - 0.3


def test_a_muon_step_orthogonalises_the_gradient_at_adamws_update_rms():
    """A gradient whose singular values span 1e-2..1 moves a matrix by a step whose singular values are all
    near ``lr * 0.2 * sqrt(max(rows, cols))`` (Newton-Schulz's near-orthogonal matrix at Liu et al.'s rate);
    the embedding, on Adam, moves by ``lr`` per element."""
    torch.manual_seed(0)
    model = Transformer(MODEL)
    lr = 1e-3
    opt = build_optimizer(model, cfg(optimizer="muon", weight_decay=0.0), lr=lr, fused=True)
    w = model.encoder_layers[0].ffn.w1.weight  # (d_ff, d_model) = (64, 32)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    u, _, vh = torch.linalg.svd(torch.randn(w.shape), full_matrices=False)
    w.grad = u @ torch.diag(torch.logspace(0, -2, min(w.shape))) @ vh
    before_w, before_e = w.detach().clone(), model.tgt_embed.weight.detach().clone()
    opt.step()
    s = torch.linalg.svdvals(before_w - w.detach())
    rate = lr * 0.2 * max(w.shape) ** 0.5
    # the first step's update is the gradient (momentum of one step), scaled to Frobenius norm 1 and put through
    # NS_COEFFICIENTS' quintic p(x) = a x + b x^3 + c x^5 five times: each singular value x goes to p^5(x).
    # Predicted here in float64 from the gradient's own spectrum (0.682..1.147 of ``rate``); measured the
    # same to 2e-6 (float32 products): rtol 1e-4
    a, b, c = NS_COEFFICIENTS
    x = torch.logspace(0, -2, min(w.shape), dtype=torch.float64)
    x = x / x.norm()
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    torch.testing.assert_close(s.double().sort().values / rate, x.sort().values, rtol=1e-4, atol=0)
    # Adam's first step is lr * g / (|g| + eps) (bias-corrected): lr to within eps / |g| relative, below 1e-3
    # unless some |g| < 1e-5 (N(0, 1) draws: ~0.02 expected among the embedding's entries); measured 2.4e-5
    moved = (before_e - model.tgt_embed.weight.detach()).abs()
    assert torch.allclose(moved, torch.full_like(moved, lr), rtol=1e-3)


def test_a_killed_muon_run_resumes_bitwise(tmp_path):
    split = synthetic_split()
    full = train(MODEL, cfg(max_steps=10, optimizer="muon"), split, None, tmp_path / "full")
    first = train(MODEL, cfg(max_steps=6, optimizer="muon", checkpoint_every=1), split, None, tmp_path / "res")
    assert first.step == 6
    state = load_checkpoint(list_checkpoints(tmp_path / "res")[-1])
    assert any("momentum_buffer" in v for v in state.optimizer["state"].values())  # Muon's state was saved
    torch.manual_seed(12345)
    second = train(MODEL, cfg(max_steps=10, optimizer="muon", checkpoint_every=1), split, None, tmp_path / "res")
    assert second.resumed_from == 6
    assert second.losses == full.losses
    assert_bitwise_equal(weights(second.model), weights(full.model))


def test_adams_fingerprint_ignores_the_muon_fields_and_muon_starts_a_fresh_run(tmp_path):
    tiny = model_preset("tiny")
    adam = TrainConfig()
    assert config_fingerprint(tiny, adam, "d") == config_fingerprint(tiny, adam.model_copy(update={"muon_momentum": 0.5}), "d")
    muon = TrainConfig(optimizer="muon")
    assert config_fingerprint(tiny, muon, "d") != config_fingerprint(tiny, adam, "d")
    assert config_fingerprint(tiny, muon, "d") != config_fingerprint(tiny, TrainConfig(optimizer="muon", muon_momentum=0.9), "d")
    split = synthetic_split()
    train(MODEL, cfg(max_steps=3), split, None, tmp_path / "ck")
    other = train(MODEL, cfg(max_steps=3, optimizer="muon"), split, None, tmp_path / "ck")
    assert other.resumed_from is None


def test_a_muon_state_refuses_adams_state():
    model = Transformer(MODEL)
    opt = build_optimizer(model, cfg(optimizer="muon"), lr=1e-3, fused=True)
    adam_state = torch.optim.Adam(model.parameters()).state_dict()
    with pytest.raises(ValueError, match="another optimizer"):
        opt.load_state_dict(adam_state)


@pytest.mark.parametrize("field", [{"distributed": "fsdp", "nproc_per_node": 2, "grad_accum": 2}, {"precision": "fp16"}])
def test_muon_refuses_fsdp_and_fp16(field):
    with pytest.raises(ValidationError, match="optimizer=muon"):
        TrainConfig(optimizer="muon", **field)


def _reference_muon_update(grad: torch.Tensor, buf: torch.Tensor, momentum: float, lr: float) -> torch.Tensor:
    """torch.optim.Muon's update of one matrix (Nesterov momentum, Newton-Schulz, ``match_rms_adamw``) in float64:
    what ``FP32Muon`` computes in fp32 and ``torch.optim.Muon`` in bf16."""
    a, b, c = NS_COEFFICIENTS
    buf = buf.double().lerp(grad.double(), 1 - momentum)
    x = grad.double().lerp(buf, momentum)
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return -lr * 0.2 * max(grad.shape) ** 0.5 * (x.T if tall else x)


def test_fp32_muon_is_torchs_muon_in_fp32_and_batched():
    """Every matrix's step is the float64 reference's to fp32 precision (torch.optim.Muon's bf16 step is ~1e-2
    away), and the momentum buffer is kept as torch.optim.Muon keeps it."""
    torch.manual_seed(0)
    shapes = [(64, 32), (32, 64), (32, 32), (32, 32), (48, 32)]  # tall, wide, a batch of two, a shape of its own
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ours = FP32Muon(params, lr=0.01, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    ref_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    theirs = torch.optim.Muon(ref_params, lr=0.01, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    bufs = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    for _ in range(3):
        grads = [torch.randn(s) for s in shapes]
        before = [p.detach().double().clone() for p in params]
        for p, q, g in zip(params, ref_params, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        for p, q, g, buf, b0 in zip(params, ref_params, grads, bufs, before):
            want = _reference_muon_update(g, buf, 0.95, 0.01)
            buf.lerp_(g.double(), 0.05)
            scale = want.norm()
            assert (p.detach().double() - b0 - want).norm() < 1e-4 * scale  # the parameters are fp32
            assert 1e-3 * scale < (q.detach().double() - b0 - want).norm() < 5e-2 * scale  # bf16's distance
            assert torch.allclose(ours.state[p]["momentum_buffer"].double(), buf, atol=1e-6)


def test_muons_step_is_the_same_bytes_on_one_thread_and_two():
    torch.manual_seed(0)
    model = Transformer(MODEL.model_copy(update={"n_layers": 2}))
    grads = [torch.randn_like(p) for p in model.parameters()]
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.copy_(start[name])
            opt = build_optimizer(model, cfg(optimizer="muon"), lr=1e-3, fused=True)
            for _ in range(2):
                for p, g in zip(model.parameters(), grads):
                    p.grad = g.clone()
                opt.step()
            results.append(weights(model))
    finally:
        torch.set_num_threads(threads)
    assert_bitwise_equal(results[0], results[1])


_ONEDNN_PROBE = """
import hashlib, torch
from aiayn.train.optim import orthogonalize
g = torch.Generator().manual_seed(0)
out = orthogonalize([torch.randn(s, generator=g) for s in [(256, 256)] * 4 + [(1024, 256)] * 2])
print(hashlib.sha256(b"".join(o.contiguous().numpy().tobytes() for o in out)).hexdigest())
"""


def test_newton_schulz_does_not_depend_on_onednns_instruction_set():
    """bf16 products go to oneDNN, whose AMX, AVX-512 BF16 and AVX-512 kernels round differently
    (torch.optim.Muon's bf16 gave three results on an AMX Xeon); the fp32 ones do not go there."""
    digests = set()
    for isa in ("", "AVX512_CORE", "AVX2"):
        env = os.environ | {"ONEDNN_MAX_CPU_ISA": isa}
        out = subprocess.run([sys.executable, "-c", _ONEDNN_PROBE], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests
