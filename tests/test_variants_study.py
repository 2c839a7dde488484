"""The seed-variance / variants study's planning (``support.variants_plan``, which
``benchmarks/studies/variants_study.py`` runs): which runs, equal parameters, flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from aiayn.config.schema import load_params
from aiayn.model import Transformer
from support import variants_plan as variants


def args(**kw) -> argparse.Namespace:
    base = dict(seeds=[1, 2, 3], data_seeds=[1, 2], variants=["rope", "gqa"], variant_seeds=[1, 2], tag="t")
    return argparse.Namespace(**(base | kw))


def test_plan_shares_the_paper_run_between_studies_and_names_every_run_once():
    runs = variants.plan(args())
    names = [r["name"] for r in runs]
    assert len(names) == len(set(names)) == 8  # paper s1..s3 and d2 (s1-d1 counted once), rope x2, gqa x2
    first = next(r for r in runs if r["name"] == "t-paper-s1-d1")
    assert first["studies"] == ["seed", "data_seed"]
    assert {(r["variant"], r["seed"], r["data_seed"]) for r in runs if "variant" in r["studies"]} == {
        ("rope", 1, 1), ("rope", 2, 1), ("gqa", 1, 1), ("gqa", 2, 1)}
    with_paper = variants.plan(args(variants=["paper"], seeds=[1], data_seeds=[1]))
    assert len(with_paper) == 2 and with_paper[0]["studies"] == ["seed", "data_seed", "variant"]


@pytest.mark.parametrize("variant", sorted(variants.VARIANTS))
def test_every_variant_gets_the_paper_models_parameter_count_within_1_percent(variant):
    root = Path(variants.ROOT)
    base = load_params(root / "params.yaml").model
    vocab = 8000
    ref = Transformer(base.model_copy(update={"vocab_size": vocab}), device="meta").num_parameters()
    over = variants.model_overrides(variant)
    fields = {k.split(".", 1)[1]: v for k, v in over.items()}
    cfg = type(base).model_validate(base.model_copy(update={"vocab_size": vocab, **fields}).model_dump())
    n = Transformer(cfg, device="meta").num_parameters()
    assert abs(n - ref) / ref <= 0.01, (variant, over, n, ref)
    if variant in ("gqa", "mqa", "decoder_only"):  # they lose attention weights: d_ff compensates
        assert over["model.d_ff"] > base.d_ff


def test_set_flags_append_keys_params_yaml_lacks():
    raw = {"train": {"seed": 1}, "model": {"preset": "tiny"}}
    assert variants.set_flag(raw, "train.seed", 2) == "train.seed=2"
    assert variants.set_flag(raw, "train.num_threads", 1) == "+train.num_threads=1"
    assert variants.set_flag(raw, "model.positions", "rope") == "+model.positions=rope"


def test_the_paper_baseline_is_the_papers_model_whatever_params_yaml_picks(monkeypatch):
    """params.yaml's model is pre-norm with rotary positions (the main job's): the study's "paper" runs must still be
    post-norm sinusoidal, and each variant differs from them in its own fields only."""
    from aiayn.config.schema import ModelConfig

    defaults = ModelConfig()
    paper = variants.model_overrides("paper")
    assert {k: paper[k] for k in variants.PAPER} == {f"model.{f}": getattr(defaults, f) for f in
                                                     ("positions", "norm", "norm_type", "activation", "n_kv_heads",
                                                      "arch")}
    assert variants.variant_config(paper).positions == "sinusoidal" and variants.variant_config(paper).norm == "post"
    assert variants.model_overrides("prenorm")["model.norm"] == "pre"
    assert variants.model_overrides("rope")["model.norm"] == "post"
    raw = {"model": {"preset": "tiny", "norm": "pre", "positions": "rope"}}
    assert variants.set_flag(raw, "model.positions", "sinusoidal") == "model.positions=sinusoidal"
    assert variants.set_flag(raw, "model.n_kv_heads", None) == "+model.n_kv_heads=null"


def test_stats_are_sample_statistics():
    st = variants.stats([30.0, 31.0, 32.0])
    assert st == {"n": 3, "mean": 31.0, "std": 1.0, "min": 30.0, "max": 32.0, "range": 2.0}
    assert variants.stats([5.0])["std"] == 0.0


def test_long_inputs_join_the_fewest_lines_that_exceed_the_limit():
    lines = ["a b", "c d e", "f", "g h i j k l", "m", "n"]
    words = lambda text: len(text.split())  # noqa: E731
    spans = variants.join_longer_than(lines, words, limit=4)
    assert spans == [(0, 2), (2, 2)]  # "m n" (2 words) cannot exceed 4: dropped
    assert all(words(" ".join(lines[i:i + k])) > 4 and 2 <= k <= 4 for i, k in spans)
    # a start that cannot reach the limit within max_join lines is skipped, the walk goes on
    assert variants.join_longer_than(["a", "b", "c", "d e f g h"], words, limit=5, max_join=2) == [(2, 2)]
    assert variants.join_longer_than(["a"] * 3, words, limit=10) == []


def test_extending_a_study_queues_only_runs_without_an_experiment_and_refuses_another_budget():
    budget = {"train.max_steps": "300"}
    old = variants.plan(args(variants=["rope"], data_seeds=[1, 2]))
    for r in old:
        r["budget"] = budget
    new = variants.plan(args(variants=["rope", "mqa"], data_seeds=[1, 2, 3]))
    done = {r["name"] for r in old} - {"t-rope-s2-d1"}  # one old run never became an experiment
    runs, todo = variants.extend(old, new, done, budget)
    assert sorted(r["name"] for r in todo) == ["t-mqa-s1-d1", "t-mqa-s2-d1", "t-paper-s1-d3", "t-rope-s2-d1"]
    assert len(runs) == len({r["name"] for r in runs}) == len(old) + 3
    assert all(r["budget"] == budget for r in runs)
    with pytest.raises(ValueError, match="budget"):
        variants.extend(old, new, done, {"train.max_steps": "600"})


def test_noise_verdict_needs_a_paper_run_and_a_seed_study():
    assert variants.noise_verdict(1.5, 0.69) == "yes"
    assert variants.noise_verdict(-1.2, 0.69) == "no"
    assert variants.noise_verdict(float("nan"), 0.69) == "n/a"
    assert variants.noise_verdict(3.0, None) == "n/a"


def test_concurrent_runs_share_the_cores():
    import os

    cores = os.cpu_count() or 1
    assert variants.threads_per_job(1) == cores
    assert variants.threads_per_job(2 * cores) == 1
