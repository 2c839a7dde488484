"""The output-detection study's logic (``support.detection_scores``, which ``benchmarks/studies/output_detection.py``
runs): labels, orientation, AUROC, the unfitted min-tail-probability combiner, precision/recall, the seeded input
noise, the early checkpoint and the corrupted model. Synthetic data with known answers; no trained model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from aiayn.quality.calibration import TAILS
from support import detection_scores as ds


# ------------------------------------------------------------------ labels


def test_chrf_labels_a_copy_of_the_reference_good_and_an_unrelated_answer_bad():
    chrf = ds.chrf_scores(["Ein Hund läuft im Park.", "xyz qqq"], ["Ein Hund läuft im Park.", "Ein Hund läuft im Park."])
    assert chrf[0] == pytest.approx(100.0) and chrf[1] < 10
    assert ds.label_bad(chrf, 30).tolist() == [False, True]
    assert ds.label_bad([29.99, 30.0, 30.01], 30).tolist() == [True, False, False]  # strictly below the cut
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        ds.chrf_scores(["a", "b"], ["a"])


# ------------------------------------------------------------------ orientation and AUROC


def test_auroc_is_one_for_a_perfect_signal_zero_reversed_half_when_constant():
    bad = [False, False, False, True, True]
    assert ds.auroc(bad, [0.1, 0.2, 0.3, 0.8, 0.9]) == 1.0
    assert ds.auroc(bad, [0.9, 0.8, 0.7, 0.2, 0.1]) == 0.0
    assert ds.auroc(bad, [5.0] * 5) == 0.5


def test_auroc_counts_ties_as_one_half_and_is_none_with_one_class():
    # pairs (bad, good): bad 0.5 vs goods 0.5 (tie: 1/2) and 0.1 (win: 1); bad 0.9 wins both -> 3.5 / 4
    assert ds.auroc([True, True, False, False], [0.5, 0.9, 0.5, 0.1]) == pytest.approx(3.5 / 4)
    assert ds.auroc([True, True], [0.1, 0.2]) is None
    assert ds.auroc([False, False], [0.1, 0.2]) is None


def test_missing_values_rank_as_most_suspicious_in_every_tail():
    for tail in ("low", "high"):
        s = ds.suspicion([0.5, math.nan, 0.7], tail)
        assert s[1] == math.inf and np.isfinite(s[[0, 2]]).all()
    assert ds.auroc([False, True, False], ds.suspicion([0.5, math.nan, 0.7], "low")) == 1.0
    with pytest.raises(ValueError, match="finite or"):
        ds.auroc([False, True], [0.1, math.nan])


def test_orientation_follows_the_tail():
    assert ds.suspicion([-0.5, -3.0], "low").tolist() == [0.5, 3.0]  # a low log-probability is suspicious
    assert ds.suspicion([0.1, 0.9], "high").tolist() == [0.1, 0.9]
    both = ds.suspicion([1.2, 0.6, 2.4, 0.0], "both", val_median=1.2)
    assert both[0] == 0 and both[1] == pytest.approx(both[2]) == pytest.approx(math.log(2)) and both[3] == math.inf
    with pytest.raises(ValueError, match="median"):
        ds.suspicion([1.0], "both")
    with pytest.raises(ValueError, match="tail"):
        ds.suspicion([1.0], "sideways")


# ------------------------------------------------------------------ the unfitted combiner


VAL = [{"seq_logprob": -0.5 - 0.01 * i, "length_ratio": 1.0 + 0.002 * i, "copy_rate": 0.01 * (i % 5)}
       for i in range(100)]


def test_tail_probability_is_the_empirical_tail_with_one_added():
    v = np.arange(1.0, 10.0)  # 1..9
    assert ds.tail_probabilities([0.0, 5.0, 10.0], "low", v).tolist() == pytest.approx([1 / 10, 6 / 10, 1.0])
    assert ds.tail_probabilities([0.0, 5.0, 10.0], "high", v).tolist() == pytest.approx([1.0, 6 / 10, 1 / 10])
    assert ds.tail_probabilities([0.0, 5.0, math.nan], "both", v).tolist() == pytest.approx([0.2, 1.0, 0.0])


def test_the_combiner_ranks_one_extreme_signal_above_in_domain_answers():
    val = ds.val_distribution(VAL, ["seq_logprob", "length_ratio", "copy_rate", "target_language_prob"])
    assert list(val) == ["seq_logprob", "length_ratio", "copy_rate"]  # no value of the language signal: left out
    in_domain = [dict(r) for r in VAL[20:80:6]]
    odd = [{**VAL[50], "copy_rate": 0.95},        # copies its source, the rest ordinary
           {**VAL[50], "length_ratio": 0.2},      # truncated (low tail of a two-tailed signal)
           {**VAL[50], "seq_logprob": -9.0},      # the model is unsure
           {**VAL[50], "seq_logprob": None}]      # not scored at all: most suspicious
    p, which = ds.min_tail_probability(in_domain + odd, val, TAILS)
    assert p[-4:].max() < p[:len(in_domain)].min()
    assert which[-4:] == ["copy_rate", "length_ratio", "seq_logprob", "seq_logprob"] and p[-1] == 0
    bad = [False] * len(in_domain) + [True] * len(odd)
    assert ds.auroc(bad, -p) == 1.0


# ------------------------------------------------------------------ precision, recall, the fitted reference


def test_precision_and_recall_count_true_positives():
    pr = ds.precision_recall([True, True, False, False, True], [True, False, True, False, True])
    assert (pr["precision"], pr["recall"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert ds.precision_recall([False, False], [True, False])["precision"] is None
    assert ds.precision_recall([True, False], [False, False])["recall"] is None


def test_logistic_reference_separates_a_separable_set_out_of_fold():
    rng = np.random.default_rng(0)
    bad = np.array([False] * 40 + [True] * 40)
    x = np.stack([np.where(bad, 3.0, 0.0) + rng.normal(0, 0.3, 80), rng.normal(0, 1, 80)], axis=1)
    assert ds.auroc(bad, ds.logistic_cv_scores(x, bad, seed=1)) > 0.95
    noise_only = x[:, 1:]
    assert ds.auroc(bad, ds.logistic_cv_scores(noise_only, bad, seed=1)) < 0.8


# ------------------------------------------------------------------ input noise


SENTENCES = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow.", "Hi"]


def test_char_noise_is_seeded_and_changes_about_its_rate():
    a = ds.char_noise(SENTENCES * 20, 0.15, seed=3)
    assert a == ds.char_noise(SENTENCES * 20, 0.15, seed=3) and a != ds.char_noise(SENTENCES * 20, 0.15, seed=4)
    assert ds.char_noise(SENTENCES, 0.0, seed=3) == SENTENCES
    changed = sum(x != y for s, n in zip(SENTENCES * 20, a) for x, y in zip(s, n.ljust(len(s))))
    total = sum(len(s) for s in SENTENCES * 20)
    assert 0.1 < changed / total  # drops shift the rest of the line, so positions differ well past the rate
    assert all(set(n) <= set("".join(SENTENCES)) | set(ds.NOISE_LETTERS) for n in a)
    with pytest.raises(ValueError):
        ds.char_noise(SENTENCES, 1.5, seed=0)


def test_shuffle_keeps_the_words_and_changes_their_order():
    from support.drift_inputs import upper

    out = ds.shuffle_words(SENTENCES, seed=2)
    assert out == ds.shuffle_words(SENTENCES, seed=2)
    for s, o in zip(SENTENCES, out):
        assert sorted(s.split()) == sorted(o.split())
        assert o != s or len(set(s.split())) < 2
    assert out[2] == "Hi" and upper(["a b"]) == ["A B"]


def test_sample_indices_are_seeded_sorted_and_unique():
    a = ds.sample_indices(1000, 60, seed=5)
    assert a == ds.sample_indices(1000, 60, seed=5) != ds.sample_indices(1000, 60, seed=6)
    assert a == sorted(set(a)) and len(a) == 60 and ds.sample_indices(10, 60, seed=5) == list(range(10))


# ------------------------------------------------------------------ degraded models


def test_early_checkpoint_only_when_well_below_the_final_step(tmp_path):
    from aiayn.checkpoint import checkpoint_step

    model, ckpts = tmp_path / "model", tmp_path / "checkpoints"
    model.mkdir(), ckpts.mkdir()
    (model / "model.json").write_text(json.dumps({"step": 1000}))
    assert ds.early_checkpoint(model, ckpts)[0] is None
    for step in (900, 600, 1000):
        (ckpts / f"ckpt_{step:08d}.json").write_text("{}")
    path, note = ds.early_checkpoint(model, ckpts)
    assert path is None and "step 600" in note
    (ckpts / "ckpt_00000500.json").write_text("{}")
    path, note = ds.early_checkpoint(model, ckpts)
    assert path.name == "ckpt_00000500.json" and checkpoint_step(path) == 500 and "500 of 1000" in note


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = torch.nn.ModuleDict({k: torch.nn.Linear(4, 4) for k in ("q_proj", "v_proj", "out_proj")})
        self.ffn = torch.nn.Linear(4, 4)


def test_corrupt_model_scales_exactly_one_value_or_output_projection():
    torch.manual_seed(0)
    model = _Tiny()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    name = ds.corrupt_model(model, seed=1, factor=8.0)
    assert name in ("self_attn.v_proj.weight", "self_attn.out_proj.weight")
    after = dict(model.named_parameters())
    assert torch.equal(after[name], before[name] * 8)
    assert all(torch.equal(after[n], before[n]) for n in before if n != name)
    assert ds.corrupt_model(_Tiny(), seed=1) == name  # the seed picks the tensor
    with pytest.raises(ValueError, match="no attention"):
        ds.corrupt_model(torch.nn.Linear(2, 2), seed=0)
