"""Validate the drift detector on real shifts: how often each kind of window is flagged.

    python benchmarks/studies/drift_validation.py [--root .] [--corpus data/multi30k] [--set test|val] [--outputs]
                                                  [--json OUT]

Needs the trained model and its reference (``dvc repro monitor_reference``). Uses the
``monitor`` block of ``params.yaml`` as it is. ``--set val`` is the tuning set (val English must
not drift; val German/French, upper-cased and noised val must); ``--set test`` is the table of
docs/studies/drift-thresholds.md (test sets, never used for tuning). Prints one row per case: windows flagged, the
descriptors that drifted (how many windows each), median embedding statistic; ``--json`` keeps
every window's summary (statistics included, so other thresholds can be read off it).

``--outputs`` also runs the output check on each window, as ``aiayn monitor --input`` does: the serving bundle
(else the trained model) answers the window, each answer's signals are judged against the output reference's
thresholds (``monitoring.output_check.output_section``), and two more columns give the windows whose answers
alarmed and the signals that did. The in-domain test windows (test_2016_flickr en, test_2017_flickr en: 20
windows drawn with fixed seeds; val is the calibration set, so never its own judge) give each check's false-alarm
rate side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from aiayn.config.schema import load_params
from aiayn.stages import Layout
from benchmarks.harness import markdown_row, markdown_table


def cases(corpus: Path, which: str, window: int) -> dict[str, list[list[str]]]:
    """The windows of each case, ``--set val`` (tuning) or ``test`` (``tests/support/drift_inputs.py``)."""
    from benchmarks.tests_support.drift_inputs import insert_noise, read_split, upper, windows

    if which == "val":
        en = read_split(corpus, "val", "en")
        return {
            "val en (same domain)": windows(en, window, 20, seed=1),
            "val de (German)": windows(read_split(corpus, "val", "de"), window, 5, seed=2),
            "val fr (French)": windows(read_split(corpus, "val", "fr"), window, 5, seed=3),
            "val en upper-cased": [upper(w) for w in windows(en, window, 5, seed=4)],
            "val en 30% words noised": [insert_noise(w, 0.3, seed=i) for i, w in enumerate(windows(en, window, 5, seed=5))],
            "train en, 30-sentence windows": windows(read_split(corpus, "train", "en"), 30, 20, seed=6),
        }
    t16, t17 = read_split(corpus, "test_2016_flickr", "en"), read_split(corpus, "test_2017_flickr", "en")
    de16 = read_split(corpus, "test_2016_flickr", "de")
    mixed = {f"test_2016_flickr en with {share}% German lines": mix(t16, de16, share / 100, window, seed=20 + share)
             for share in (10, 25, 50)}
    return mixed | {
        "test_2016_flickr en": windows(t16, window, 10, seed=11),
        "test_2017_flickr en": windows(t17, window, 10, seed=12),
        "test_2017_mscoco en (COCO)": windows(read_split(corpus, "test_2017_mscoco", "en"), window, 5, seed=13),
        "test_2016_flickr de (German)": windows(read_split(corpus, "test_2016_flickr", "de"), window, 5, seed=14),
        "test_2017_flickr fr (French)": windows(read_split(corpus, "test_2017_flickr", "fr"), window, 5, seed=15),
        "test_2016_flickr en upper-cased": [upper(w) for w in windows(t16, window, 5, seed=16)],
        "test_2016_flickr en 30% words noised": [insert_noise(w, 0.3, seed=i)
                                                 for i, w in enumerate(windows(t16, window, 5, seed=17))],
    }


def mix(english: list[str], other: list[str], share: float, window: int, seed: int, count: int = 5) -> list[list[str]]:
    """``count`` windows of ``window`` sentences, ``share`` of them from ``other`` (the detection limit)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    k = round(share * window)
    out = []
    for _ in range(count):
        w = [english[i] for i in rng.choice(len(english), window - k, replace=False)]
        w += [other[i] for i in rng.choice(len(other), k, replace=False)]
        out.append([w[i] for i in rng.permutation(len(w))])
    return out


def output_judge(root: Path, params):
    """A function from windows to the output check's section (``monitoring.output_check.output_section``) of
    each window's answers; the output reference and the served model are loaded once, here."""
    from monitoring.output_check import answer_signals, load_output_reference, output_section, served_translator
    from monitoring.reference import reference_dir

    layout = Layout(root)
    reference = load_output_reference(reference_dir(layout))
    if reference is None:
        raise SystemExit("no output reference: run `dvc repro monitor_reference` first")
    translator, options, _ = served_translator(params, layout)

    def judge(windows: list[list[str]]) -> list[dict]:
        return [output_section(reference, answer_signals(translator, options, w, reference["tgt_lang"])[1],
                               params.monitor) for w in windows]

    return judge


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".")
    p.add_argument("--corpus", default=None, help="raw corpus folder (default: <root>/data/multi30k)")
    p.add_argument("--set", choices=("val", "test"), default="test")
    p.add_argument("--outputs", action="store_true", help="also the output check on each window's answers")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from aiayn.inference.translator import Translator
    from monitoring.drift import check, load_reference
    from monitoring.reference import reference_dir

    root = Path(args.root).resolve()
    params = load_params(root / "params.yaml")
    layout = Layout(root)
    ref = load_reference(reference_dir(layout))
    translator = Translator.from_dir(layout.model, device="cpu")
    cfg = params.monitor
    corpus = Path(args.corpus) if args.corpus else layout.raw
    out: dict[str, list[dict]] = {}
    print(f"monitor params: stattest {cfg.stattest} threshold {cfg.stattest_threshold} {dict(cfg.thresholds)}, "
          f"drift_share {cfg.drift_share}, embeddings {cfg.embedding_method} "
          f"{cfg.embedding_threshold or 'default'}; reference {len(ref)} sentences")
    judge = output_judge(root, params) if args.outputs else None
    more = ["answers alarmed", "signals that alarmed (windows)"] if judge else []
    print(markdown_table(["windows", "sentences", "flagged", "descriptors that drifted (windows)", "embeddings drifted",
                          f"median {cfg.embedding_method}", "s/check", *more], []))
    for name, ws in cases(corpus, args.set, cfg.window_size).items():
        t0 = time.perf_counter()
        summaries = [check(w, ref, cfg, translator).summary for w in ws]
        seconds = (time.perf_counter() - t0) / len(ws)
        out[name] = summaries
        flagged = sum(s["verdict"] == "drift" for s in summaries)
        moved = Counter(k for s in summaries for k, t in s["descriptors"].items() if t["drifted"])
        emb = [s["embeddings"] for s in summaries if s["embeddings"]]
        emb_drift = sum(e["drifted"] for e in emb)
        med = statistics.median(e["statistic"] for e in emb) if emb else float("nan")
        moved_txt = ", ".join(f"{k} {v}" for k, v in moved.most_common()) or "none"
        cells = []
        if judge:
            sections = judge(ws)
            for s, section in zip(summaries, sections):
                s["outputs"] = section
            alarmed = Counter(a for section in sections for a in section.get("alarms", []))
            cells = [f"{sum(x['verdict'] == 'alarm' for x in sections)}/{len(ws)}",
                     ", ".join(f"{k} {v}" for k, v in alarmed.most_common()) or "none"]
        print(markdown_row([name, f"{len(ws)} x {len(ws[0])}", f"{flagged}/{len(ws)}", moved_txt, f"{emb_drift}/{len(emb)}",
                            f"{med:.4g}", f"{seconds:.1f}", *cells]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
