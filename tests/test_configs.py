"""Configs: params.yaml / smoke / WMT14 files load, and the paper's settings hold with no silent deviation."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.config.schema import ConfigError, load_params, model_preset, params_from_dict
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
    """docs/training.md's "Every deviation from the paper" table: ``{what: here}``."""
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8").split("Every deviation from the paper", 1)[1]
    rows = {}
    for line in text.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[2]
    return rows


# The paper's value of each training and decoding setting the main job may change, and the deviation row that
# must name the main job's value when it does (Vaswani et al. 2017: Sec. 5.3 warmup and eq. 3's inverse square
# root, 5.3 Adam, 5.4 label smoothing, 6.1 alpha; 3.5k-37k vocabularies in Sec. 5.1). Model fields are compared with the preset.
PAPER_SETTINGS = {
    ("train", "label_smoothing"): (0.1, "label smoothing"),
    ("train", "warmup_steps"): (4000, "warmup_steps"),
    ("train", "lr_decay"): ("inverse_sqrt", "lr after warmup"),
    ("train", "lr_scale"): (1.0, "lr_scale"),
    ("train", "optimizer"): ("adam", "optimizer"),
    ("train", "clip_norm"): (None, "gradient clipping"),
    ("evaluate", "len_penalty"): (0.6, "length penalty"),
    ("tokenize", "vocab_size"): (37000, "BPE vocabulary"),
}


def _names_value(row: str, value) -> bool:
    """A deviation row's "here" cell gives ``value`` for the main job."""
    forms = {str(value), f"`{value}`"} | ({f"{value:g}"} if isinstance(value, float) else set())
    return "in the main job" in row and any(f in row for f in forms)


def _row(rows: dict[str, str], what: str) -> str:
    return next((v for k, v in rows.items() if k.replace("`", "").startswith(what)), "")


def test_every_deviation_of_the_main_job_has_a_readme_row():
    """No silent deviation: every ``model:`` field params.yaml sets to other than the preset's (the paper's), and
    every training or decoding setting of PAPER_SETTINGS that differs from the paper's, has a row in docs/training.md's
    deviation table naming the main job's value."""
    import yaml

    raw = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    p, rows = load_params(REPO / "params.yaml"), _deviation_rows()
    preset = model_preset(p.model_preset)
    missing = []
    for field in (k for k in raw["model"] if k != "preset"):
        here = getattr(p.model, field)
        if here != getattr(preset, field) and not _names_value(_row(rows, field.replace("_", " ")) or _row(rows, field), here):
            missing.append((f"model.{field}", here))
    for (block, field), (paper, what) in PAPER_SETTINGS.items():
        here = getattr(getattr(p, block), field)
        if here != paper and not _names_value(_row(rows, what), here):
            missing.append((f"{block}.{field}", here))
    assert not missing, f"deviations from the paper with no docs/training.md row naming the main job's value: {missing}"


def test_the_deviation_check_sees_a_missing_row():
    rows = _deviation_rows()
    assert _names_value(_row(rows, "label smoothing"), load_params(REPO / "params.yaml").train.label_smoothing)
    assert not _names_value(_row(rows, "label smoothing"), 0.33) and not _names_value(_row(rows, "no such row"), 0.2)


def test_default_job_keeps_paper_loss_and_decoding():
    """What the main job keeps of the paper's training and decoding (the deviations are the test above's)."""
    p = load_params(REPO / "params.yaml")
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
