"""How well the output signals detect bad translations: AUROC per signal, an unfitted combined detector, and the
precision and recall of the calibrated rule.

A labelled set of answers is built from conditions (``--sentences`` each, sampled with ``--seed``):

- in-domain: test_2016_flickr, test_2017_flickr, test_2017_mscoco sources as prepared;
- shifted inputs: the French and the Czech caption of test_2016_flickr (the raw corpus, ``--mirror``) sent as if
  English, with the German of the same line as reference (Multi30k is multi-way parallel); test_2016_flickr with
  character noise (``--noise`` of the characters dropped, swapped or substituted, seeded), its words shuffled,
  and upper-cased. No other domain: nothing on disk has out-of-domain English with German references;
- degraded models on test_2016_flickr: the oldest kept checkpoint when its step is at most half the final one
  (otherwise the condition is skipped and the report says why), and the final model with one attention value or
  output projection (chosen with ``--seed``) scaled by 8, as a broken int8 scale would do.

The answers are produced as ``aiayn translate --signals --long split`` produces them (``aiayn.cli.translate_output
.answers``): the serving bundle (``artifacts/export``) when the project has one, else ``artifacts/model`` with the
``evaluate`` block of ``ROOT/params.yaml``; the degraded models are decoded eagerly with the same options. An
answer is BAD when its sentence chrF (sacreBLEU's defaults) against the reference is below ``--chrf-cut``.

Per signal, AUROC of its value oriented by its bad tail (``length_ratio``: ``|log(x / val median)|``); missing
values rank as most suspicious. The combined detector fits nothing on the labelled set: each signal's in-domain
tail probability against the val answers' values, the minimum over signals. The thresholds and the val values come
from ``artifacts/monitor_reference/output_reference.json``, or, without one, from the val split answered here and
``calibrate(..., false_flag_rate=0.02)``. A logistic regression with 5-fold cross-validation is reported as a
FITTED upper reference. The logic is ``tests/support/detection_scores.py`` (tested).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import host_line, markdown_table

IN_DOMAIN = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
SHIFT_SPLIT = "test_2016_flickr"
FOREIGN = ("fr", "cs")
EXAMPLES = 20
CORRUPT_FACTOR = 8.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path("."), help="project root after the pipeline ran (default: .)")
    p.add_argument("--mirror", type=Path, default=None,
                   help="the raw Multi30k folder (*.{en,de,fr,cs}.gz; default: ROOT/data/multi30k)")
    p.add_argument("--sentences", type=int, default=300, help="sentences per condition (default 300)")
    p.add_argument("--chrf-cut", type=float, default=30.0, help="BAD: sentence chrF below this (default 30)")
    p.add_argument("--noise", type=float, default=0.15, help="character noise rate (default 0.15)")
    p.add_argument("--val-sentences", type=int, default=None,
                   help="without an output reference: answer only this many val sentences to calibrate (default all)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for decoding (default 2)")
    p.add_argument("--seed", type=int, default=1, help="sampling, noise, shuffling, the corrupted tensor, CV folds")
    p.add_argument("--out", type=Path, required=True, help="JSON with every number and 20 bad examples per condition")
    args = p.parse_args(argv)
    if args.sentences < 10:
        p.error("--sentences must be at least 10")
    if not 0 < args.noise < 1:
        p.error("--noise must be in (0, 1)")
    args.mirror = args.mirror if args.mirror is not None else args.root / "data" / "multi30k"
    for lang in FOREIGN:
        if not (args.mirror / f"{SHIFT_SPLIT}.{lang}.gz").is_file():
            p.error(f"{args.mirror / f'{SHIFT_SPLIT}.{lang}.gz'} not found: pass the raw Multi30k folder as --mirror")
    return args


# ---------------------------------------------------------------------------------------------- models and answers


class Answerer:
    """The served translator (bundle or model), its options, the target language and one language scorer."""

    def __init__(self, root: Path, threads: int) -> None:
        import torch

        from aiayn.cli.translate_output import target_lang
        from aiayn.config.schema import Params, load_params
        from aiayn.inference.runtimes import DecodeOptions
        from aiayn.inference.translator import Translator
        from aiayn.quality.signals import LanguageScorer
        from aiayn.stages import Layout

        torch.set_num_threads(threads)
        self.layout = Layout(root)
        self.params = load_params(root / "params.yaml") if (root / "params.yaml").is_file() else Params()
        bundle = self.layout.export if (self.layout.export / "bundle.json").is_file() else None
        if bundle is not None:
            from aiayn.inference.load import load

            predictor = load(bundle, threads=threads)
            self.served, self.options = predictor.translator, predictor.options
            self.served_by = f"bundle {bundle} ({predictor.info.get('variant', 'bundle')})"
        else:
            self.served = Translator.from_dir(self.layout.model, device="cpu")
            self.options = DecodeOptions.from_eval(self.params.evaluate)
            self.served_by = f"model {self.layout.model} (eager, evaluate options)"
        self.lang = target_lang(bundle, lambda: self.params.data.tgt_lang)
        self.language = LanguageScorer()

    def answer(self, translator: Any, sources: list[str]) -> tuple[list[str], list[dict | None]]:
        """Translations and signals of ``sources``, as ``aiayn translate --signals --long split`` computes them."""
        from aiayn.cli.translate_output import answers

        decode = answers(translator, self.options, nbest=1, scores=True, signals=(self.language, self.lang))
        prepared = translator.prepare(sources, self.options, long="split", warn_unknown=False)
        texts, rows = [], []
        for chunk in decode(prepared, self.options.max_tokens):
            for line in chunk:
                texts.append(line[0].text)
                rows.append(line[0].signals)
        return texts, rows

    def eager(self, weights: Path | None = None) -> Any:
        from aiayn.inference.translator import Translator

        return Translator.from_dir(self.layout.model, weights=weights, device="cpu")


# ---------------------------------------------------------------------------------------------- conditions


def read_pair(folder: Path, split: str, src: str, tgt: str, gz: bool) -> tuple[list[str], list[str]]:
    from aiayn.data.readers import read_lines

    ext = ".gz" if gz else ""
    a, b = read_lines(folder / f"{split}.{src}{ext}"), read_lines(folder / f"{split}.{tgt}{ext}")
    if len(a) != len(b):
        raise ValueError(f"{folder / split}: {len(a)} {src} lines but {len(b)} {tgt} lines")
    return a, b


def conditions(args: argparse.Namespace, ans: Answerer) -> tuple[list[dict], list[str]]:
    """The conditions: name, group, sources, references, which translator answers them; and the notes."""
    from aiayn.checkpoint import checkpoint_step
    from benchmarks.tests_support.detection_scores import char_noise, early_checkpoint, sample_indices, shuffle_words
    from benchmarks.tests_support.drift_inputs import upper

    d, prepared, n, seed = ans.params.data, ans.layout.prepared, args.sentences, args.seed
    out, notes = [], []
    for split in IN_DOMAIN:
        src, ref = read_pair(prepared, split, d.src_lang, d.tgt_lang, gz=False)
        idx = sample_indices(len(src), n, seed)
        out.append({"name": split, "group": "in-domain", "sources": [src[i] for i in idx],
                    "references": [ref[i] for i in idx], "model": "served"})
    for lang in FOREIGN:
        src, ref = read_pair(args.mirror, SHIFT_SPLIT, lang, d.tgt_lang, gz=True)
        idx = sample_indices(len(src), n, seed)
        out.append({"name": f"{SHIFT_SPLIT} {lang} as {d.src_lang}", "group": "shifted input",
                    "sources": [src[i] for i in idx], "references": [ref[i] for i in idx], "model": "served"})
    src, ref = read_pair(prepared, SHIFT_SPLIT, d.src_lang, d.tgt_lang, gz=False)
    idx = sample_indices(len(src), n, seed)
    base, refs = [src[i] for i in idx], [ref[i] for i in idx]
    for name, sources in ((f"{SHIFT_SPLIT} char noise {args.noise:.0%}", char_noise(base, args.noise, seed)),
                          (f"{SHIFT_SPLIT} words shuffled", shuffle_words(base, seed)),
                          (f"{SHIFT_SPLIT} upper-cased", upper(base))):
        out.append({"name": name, "group": "shifted input", "sources": sources, "references": refs,
                    "model": "served"})
    notes.append("no other-domain condition: nothing on disk has non-caption English with German references")
    ckpt, note = early_checkpoint(ans.layout.model, ans.layout.checkpoints)
    notes.append(note)
    if ckpt is not None:
        out.append({"name": f"{SHIFT_SPLIT} early checkpoint (step {checkpoint_step(ckpt)})", "group": "degraded model",
                    "sources": base, "references": refs, "model": ckpt})
    out.append({"name": f"{SHIFT_SPLIT} corrupted model", "group": "degraded model", "sources": base,
                "references": refs, "model": "corrupted"})
    return out, notes


def answer_conditions(conds: list[dict], ans: Answerer, seed: int, notes: list[str]) -> list[dict]:
    """One record per answer: condition, source, reference, output, signals (chrF and labels come later)."""
    from benchmarks.tests_support.detection_scores import corrupt_model

    records = []
    for c in conds:
        t0 = time.perf_counter()
        if c["model"] == "served":
            translator = ans.served
        elif c["model"] == "corrupted":
            translator = ans.eager()
            name = corrupt_model(translator.decoder.model, seed, CORRUPT_FACTOR)
            notes.append(f"corrupted model: {name} scaled by {CORRUPT_FACTOR:g}")
        else:
            translator = ans.eager(c["model"])
        texts, rows = ans.answer(translator, c["sources"])
        for s, r, t, sig in zip(c["sources"], c["references"], texts, rows):
            records.append({"condition": c["name"], "group": c["group"], "source": s, "reference": r, "output": t,
                            "signals": sig})
        print(f"  {c['name']}: {len(texts)} answers in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return records


def reference_thresholds(args: argparse.Namespace, ans: Answerer) -> tuple[dict, list[dict | None], str]:
    """``(thresholds, val rows, where from)``: the output reference's, else the val split answered and calibrated."""
    from aiayn.quality.calibration import OUTPUT_REFERENCE_PATH, calibrate
    from aiayn.quality.signals import SIGNALS

    path = args.root / OUTPUT_REFERENCE_PATH
    if path.is_file():
        ref = json.loads(path.read_text(encoding="utf-8"))
        values = ref["values"]
        n = max(len(v) for v in values.values())
        rows = [{name: values[name][i] for name in SIGNALS if name in values} for i in range(n)]
        return ref["thresholds"], rows, f"{path} (answered by {ref.get('answered_by')}, {n} val sentences)"
    d = ans.params.data
    from aiayn.data.readers import read_lines
    from benchmarks.tests_support.detection_scores import sample_indices

    val = read_lines(ans.layout.prepared / f"{d.valid_split}.{d.src_lang}")
    if args.val_sentences is not None:
        val = [val[i] for i in sample_indices(len(val), args.val_sentences, args.seed)]
    _, rows = ans.answer(ans.served, val)
    return (calibrate(rows, false_flag_rate=0.02), rows,
            f"calibrated here: {len(val)} {d.valid_split} sentences answered by {ans.served_by}, false_flag_rate 0.02")


# ---------------------------------------------------------------------------------------------- analysis


def analyse(records: list[dict], thresholds: dict, val_rows: list[dict | None], seed: int) -> dict[str, Any]:
    """Per signal AUROC and its own flag's precision/recall, the combined detectors, the rule's precision/recall."""
    import numpy as np

    from aiayn.quality.calibration import TAILS, flags
    from aiayn.quality.signals import SIGNALS
    from benchmarks.tests_support.detection_scores import (auroc, logistic_cv_scores, min_tail_probability,
                                                           precision_recall, suspicion, val_distribution, values_of)

    rows = [r["signals"] for r in records]
    bad = np.array([r["bad"] for r in records], dtype=bool)
    val = val_distribution(val_rows, SIGNALS)
    flag_rows = [flags(s, thresholds) for s in rows]
    per_signal, features = {}, []
    for name in val:
        median = float(np.median(val[name])) if TAILS[name] == "both" else None
        score = suspicion(values_of(rows, name), TAILS[name], median)
        finite = score[np.isfinite(score)]
        features.append(np.where(np.isfinite(score), score, (finite.max() + 1) if finite.size else 0.0))
        entry = {"tail": TAILS[name], "auroc": auroc(bad, score)}
        if TAILS[name] == "both":
            entry["orientation"] = f"|log(x / {median:.4f})| (val median)"
        if name in thresholds:
            entry.update(precision_recall([f.get(name, False) for f in flag_rows], bad))
        per_signal[name] = entry
    p, which = min_tail_probability(rows, val, TAILS)
    rule = precision_recall([any(f.values()) for f in flag_rows], bad)
    out: dict[str, Any] = {"signals": per_signal, "rule_any_signal": rule,
                           "combined_min_tail_probability": {"auroc": auroc(bad, -p), "fitted": False},
                           "tail_probabilities": [float(x) for x in p], "most_surprising": which}
    if bad.sum() >= 5 and (~bad).sum() >= 5:
        probs = logistic_cv_scores(np.stack(features, axis=1), bad, seed=seed)
        out["logistic_regression_cv"] = {"auroc": auroc(bad, probs), "fitted": True, "folds": 5,
                                         "features": list(val)}
    else:
        out["logistic_regression_cv"] = {"auroc": None, "fitted": True, "note": "fewer than 5 of a class"}
    out["flag_rows"] = flag_rows
    return out


def per_condition(records: list[dict], result: dict) -> list[dict]:
    """Per condition: n, bad share, mean chrF, flagged share (rule), combined AUROC within it."""
    import numpy as np

    from benchmarks.tests_support.detection_scores import auroc

    p = np.asarray(result["tail_probabilities"])
    out = []
    for name in dict.fromkeys(r["condition"] for r in records):
        k = [i for i, r in enumerate(records) if r["condition"] == name]
        bad = np.array([records[i]["bad"] for i in k])
        out.append({"condition": name, "group": records[k[0]]["group"], "n": len(k), "bad_share": float(bad.mean()),
                    "mean_chrf": float(np.mean([records[i]["chrf"] for i in k])),
                    "flagged_share": float(np.mean([any(result["flag_rows"][i].values()) for i in k])),
                    "combined_auroc": auroc(bad, -p[k])})
    return out


def _f(x: Any, spec: str = ".3f") -> str:
    return "—" if x is None else f"{x:{spec}}"


def tables(result: dict, counts: list[dict]) -> str:
    count_table = markdown_table(
        ["condition", "group", "n", "bad share", "mean chrF", "flagged (rule)", "combined AUROC within"],
        [[c["condition"], c["group"], c["n"], f"{c['bad_share']:.0%}", f"{c['mean_chrf']:.1f}",
          f"{c['flagged_share']:.0%}", _f(c["combined_auroc"])] for c in counts], "llrrrrr")
    rows = [[f"`{name}` ({e['tail']})", _f(e["auroc"]), _f(e.get("precision")), _f(e.get("recall"))]
            for name, e in result["signals"].items()]
    rule = result["rule_any_signal"]
    combined = result["combined_min_tail_probability"]["auroc"]
    rows += [["combined: min in-domain tail probability (unfitted)", _f(combined), "—", "—"],
             ["calibrated rule: any signal flags", "—", _f(rule["precision"]), _f(rule["recall"])],
             ["logistic regression, 5-fold CV (FITTED, upper reference)",
              _f(result["logistic_regression_cv"]["auroc"]), "—", "—"]]
    signal_table = markdown_table(["signal", "AUROC", "precision", "recall"], rows, "lrrr")
    return count_table + "\n\n" + signal_table


def examples(records: list[dict], flag_rows: list[dict]) -> dict[str, list[dict]]:
    """Up to ``EXAMPLES`` bad answers per condition (the lowest chrF first)."""
    out: dict[str, list[dict]] = {}
    for i in sorted(range(len(records)), key=lambda i: records[i]["chrf"]):
        r = records[i]
        if r["bad"] and len(out.setdefault(r["condition"], [])) < EXAMPLES:
            out[r["condition"]].append({k: r[k] for k in ("source", "reference", "output", "chrf", "signals")}
                                       | {"flagged_by": [n for n, f in flag_rows[i].items() if f]})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python benchmarks/studies/output_detection.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    from aiayn.io import atomic_write_json
    from benchmarks.tests_support.detection_scores import chrf_scores, label_bad

    t0 = time.perf_counter()
    host = host_line()
    ans = Answerer(args.root, args.threads)
    conds, notes = conditions(args, ans)
    thresholds, val_rows, thresholds_from = reference_thresholds(args, ans)
    records = answer_conditions(conds, ans, args.seed, notes)
    chrf = chrf_scores([r["output"] for r in records], [r["reference"] for r in records])
    for r, c, b in zip(records, chrf, label_bad(chrf, args.chrf_cut)):
        r["chrf"], r["bad"] = c, bool(b)
    result = analyse(records, thresholds, val_rows, args.seed)
    counts = per_condition(records, result)
    text = tables(result, counts)
    combined, slp = result["combined_min_tail_probability"]["auroc"], result["signals"]["seq_logprob"]["auroc"]
    goal = (f"goal: combined AUROC >= 0.85 ({_f(combined)}: {'met' if combined and combined >= 0.85 else 'not met'}), "
            f"Seq-Logprob >= 0.80 ({_f(slp)}: {'met' if slp and slp >= 0.80 else 'not met'})")
    wall = time.perf_counter() - t0
    print(host)
    print(f"`{command}`")
    print(f"answers: {ans.served_by}; thresholds: {thresholds_from}; BAD = sentence chrF < {args.chrf_cut:g}; "
          f"{len(records)} answers, {sum(r['bad'] for r in records)} bad")
    for note in notes:
        print(f"note: {note}")
    print()
    print(text)
    print()
    print(goal)
    print(f"wall time {wall:.0f} s")
    atomic_write_json(args.out, {
        "host": host, "command": command, "served_by": ans.served_by, "thresholds_from": thresholds_from,
        "thresholds": thresholds, "chrf_cut": args.chrf_cut, "seed": args.seed, "sentences": args.sentences,
        "noise": args.noise, "notes": notes, "conditions": counts, "goal": goal, "wall_s": round(wall, 1),
        "table": text, **{k: v for k, v in result.items() if k not in ("flag_rows", "tail_probabilities",
                                                                        "most_surprising")},
        "most_surprising_counts": {n: result["most_surprising"].count(n) for n in set(result["most_surprising"])},
        "examples_bad": examples(records, result["flag_rows"]),
    })
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
