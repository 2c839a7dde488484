"""The evaluate stage reports its answers' output signals per test split (aiayn.stages.evaluate): their means
in eval_metrics.json and the tracker, and, when the drift monitor's output reference was built for the
evaluated model, the share of answers its thresholds flag (tracker only). The hypotheses, BLEU and the
existing metric keys do not change."""

from __future__ import annotations

import contextlib
import json

import pytest
from support import tiny

from aiayn.config.schema import params_from_dict
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from aiayn.io import sha256_file
from aiayn.quality.signals import SIGNALS
from aiayn.recording import NullRun
from aiayn.stages import evaluate as evaluate_stage

PARAMS = params_from_dict({"data": {"test_splits": ["test_a", "test_b"]},
                           "evaluate": {"beam_size": 1, "max_len_b": 8, "device": "cpu", "long_policy": "split"}})


class _Spy(NullRun):
    """A run that keeps every metric it is given (and checks each call as every recorder does)."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metrics(self, metrics, step: int) -> None:
        super().log_metrics(metrics, step)
        self.metrics.update(metrics)


class _SpyRecorder:
    def __init__(self) -> None:
        self.run = _Spy()

    @contextlib.contextmanager
    def start(self, record):
        yield self.run


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate-signals")
    return tiny.project(root / "proj", tiny.tokenizer(root))


def _run(layout) -> dict[str, float]:
    spy = _SpyRecorder()
    evaluate_stage.run(PARAMS, layout, spy)
    return spy.run.metrics


def _reference(layout, model_sha256: str, high: float) -> None:
    """A hand-written output reference: every answer over ``high`` times its source's length flags ``length_ratio``."""
    folder = layout.root / evaluate_stage.OUTPUT_REFERENCE.parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reference.json").write_text(json.dumps({"model_sha256": model_sha256}))
    (folder / "output_reference.json").write_text(json.dumps({"thresholds": tiny.length_thresholds(high)}))


def test_signal_means_join_the_metrics_and_the_hypotheses_stay_the_same(layout):
    logged = _run(layout)
    metrics = json.loads(layout.eval_metrics.read_text())
    tr = Translator.from_dir(layout.model, device="cpu")
    for split in ("test_a", "test_b"):
        m = metrics[split]
        assert set(m) == {"bleu", "chrf", "bleu_lc_tok", "signal_mean"}  # the existing keys, unchanged
        sources = (layout.prepared / f"{split}.en").read_text().splitlines()
        plain = evaluate_stage.decode_split(tr, sources, DecodeOptions(beam_size=1, max_len_b=8), "split")
        assert (layout.eval / f"{split}.hyp.de").read_text().splitlines() == plain  # the same hypotheses
        assert set(m["signal_mean"]) == set(SIGNALS)
        assert m["signal_mean"]["seq_logprob"] < 0 and 0 <= m["signal_mean"]["copy_rate"] <= 1
        assert {k: v for k, v in logged.items() if k.startswith(f"{split}.signal_mean.")} == \
            {f"{split}.signal_mean.{k}": v for k, v in m["signal_mean"].items()}
    assert metrics["test_a"]["bleu"] == 100.0  # test_a's references are this model's own greedy output
    assert not any(".flagged_share." in k for k in logged)  # no output reference: means only


def test_flagged_shares_come_from_a_reference_built_for_this_model(layout, tmp_path):
    import shutil

    from aiayn.stages import Layout

    layout = Layout(shutil.copytree(layout.root, tmp_path / "proj"))  # its own copy: it writes an output reference
    tr = Translator.from_dir(layout.model, device="cpu")
    options = DecodeOptions(beam_size=1, max_len_b=8)
    ratios = {}
    for split in ("test_a", "test_b"):
        sources = (layout.prepared / f"{split}.en").read_text().splitlines()
        _, signals = evaluate_stage.decode_split_signals(tr, sources, options, "split", target_lang="de", language=None)
        ratios[split] = [s["length_ratio"] for s in signals]
    high = sorted(ratios["test_a"])[len(ratios["test_a"]) // 2]  # test_a's median: about half its answers flag
    _run(layout)
    before = layout.eval_metrics.read_bytes()
    _reference(layout, "0" * 64, high)  # built for another model: ignored
    assert not any(".flagged_share." in k for k in _run(layout))
    _reference(layout, sha256_file(layout.model / "model.safetensors"), high)
    logged = _run(layout)
    assert layout.eval_metrics.read_bytes() == before  # the DVC output does not depend on the reference
    for split, values in ratios.items():
        share = sum(r > high for r in values) / len(values)
        assert split == "test_b" or 0 < share < 1, share  # the test can tell a share from 0 and from 1
        assert logged[f"{split}.flagged_share.length_ratio"] == pytest.approx(share, abs=1e-6)
        assert logged[f"{split}.flagged_share.copy_rate"] == 0.0  # a copy rate is never above 2
        assert logged[f"{split}.flagged_share.any"] == logged[f"{split}.flagged_share.length_ratio"]
