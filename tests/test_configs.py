"""Configs: params.yaml / smoke / WMT14 files load, and the paper's settings hold with no silent deviation."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.config import ConfigError, load_params, model_preset, params_from_dict
from aiayn.model import Transformer

REPO = Path(__file__).resolve().parents[1]

# Vaswani et al. 2017: Table 3 (architecture, parameter count), Sec. 5.3-5.4 and 6.1 (training, decoding).
PAPER = {
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1, params=65e6, average_last=5),
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3, params=213e6, average_last=20),
}


@pytest.mark.parametrize("preset", ["base", "big"])
def test_wmt14_configs_are_the_papers(preset):
    p = load_params(REPO / "configs" / f"wmt14_{preset}.yaml")
    want = PAPER[preset]
    m = p.model
    assert (m.d_model, m.n_heads, m.d_ff, m.n_layers, m.dropout) == (
        want["d_model"], want["n_heads"], want["d_ff"], want["n_layers"], want["dropout"])
    assert m.head_dim == 64 and m.norm == "post" and m.share_embeddings and m.activation == "relu"
    assert p.tokenize.vocab_size == 37000 and p.tokenize.model_type == "bpe"
    t = p.train
    assert (t.label_smoothing, t.warmup_steps, t.lr_scale, tuple(t.adam_betas), t.adam_eps) == (0.1, 4000, 1.0, (0.9, 0.98), 1e-9)
    assert t.max_tokens == 25000 and t.average_last == want["average_last"]
    e = p.evaluate
    assert (e.beam_size, e.len_penalty, e.max_len_a, e.max_len_b) == (4, 0.6, 1.0, 50)
    n = Transformer(m.model_copy(update={"vocab_size": p.tokenize.vocab_size}), device="meta").num_parameters()
    assert abs(n - want["params"]) / want["params"] < 0.05, f"{preset}: {n / 1e6:.1f}M vs paper {want['params'] / 1e6:.0f}M"


@pytest.mark.parametrize("name", ["params.yaml", "configs/smoke.yaml"])
def test_shipped_params_files_load(name):
    p = load_params(REPO / name)
    assert p.train.keep_checkpoints >= p.train.average_last
    assert p.model_preset == "tiny"


def _deviation_rows() -> dict[str, str]:
    """README's "Every deviation from the paper" table: ``{what: here}``."""
    text = (REPO / "README.md").read_text(encoding="utf-8").split("Every deviation from the paper", 1)[1]
    rows = {}
    for line in text.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[2]
    return rows


def test_default_job_keeps_paper_loss_and_decoding():
    """The CPU main job deviates from the paper only where README's deviation table says so (no silent deviation):
    label smoothing and dropout are the paper's or a row gives the main job's value; the rest stay the paper's."""
    p = load_params(REPO / "params.yaml")
    rows = _deviation_rows()
    for what, paper, here in (("label smoothing", 0.1, p.train.label_smoothing), ("dropout", 0.1, p.model.dropout)):
        row = next((v for k, v in rows.items() if k.startswith(what)), "")
        assert here == paper or f"{here:g} in the main job" in row, (what, here, row)
    assert tuple(p.train.adam_betas) == (0.9, 0.98) and p.train.adam_eps == 1e-9
    # beam 4 and max length +50 are the paper's (Sec. 6.1); alpha is tuned on val as the paper tuned it on its dev set
    assert (p.evaluate.beam_size, p.evaluate.len_penalty, p.evaluate.max_len_b) == (4, 1.0, 50)
    assert p.tokenize.model_type == "bpe"


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="unknown model preset 'huge'"):
        model_preset("huge")
    with pytest.raises(ConfigError, match="d_model=100 is not divisible by n_heads=3"):
        params_from_dict({"model": {"preset": "tiny", "d_model": 100, "n_heads": 3}})
    with pytest.raises(ConfigError, match="warmup_stepz"):
        params_from_dict({"train": {"warmup_stepz": 10}})
    with pytest.raises(ConfigError, match="unknown params.yaml section"):
        params_from_dict({"trian": {}})
    with pytest.raises(ConfigError, match="not found"):
        load_params(REPO / "nope.yaml")
