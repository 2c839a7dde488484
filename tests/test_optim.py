"""``train.optimizer``: the paper's Adam, or Muon for the layers' weight matrices (aiayn.train.optim)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.config import TrainConfig, model_preset
from aiayn.model import Transformer
from aiayn.train import train
from aiayn.train.optim import MuonWithAdam, build_optimizer, muon_parameter
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
    assert s.max() < 1.3 * rate and s.min() > 0.5 * rate, (s.min() / rate, s.max() / rate)
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
