"""Why the Multi30k test sets score apart: what each split holds that training did not, and each model's BLEU on
the part of each split that training covers.

The held-out Flickr sets (test_2016_flickr, test_2017_flickr) score apart; this measures whether that gap is the
model's or the data's (docs/studies/split-gap.md). For each split of a prepared project (``artifacts/prepared``:
the text the models were trained and scored on) it counts, with sacreBLEU's 13a tokenizer (the one BLEU uses):
sentence lengths; reference tokens whose word never occurs in the training targets ("unseen"); reference 4-grams
never in the training targets. Then, for each ``--hyps`` folder (an ``artifacts/eval`` of a finished run: one
``<split>.hyp.<tgt>`` per test split), sacreBLEU on the whole split and on its "covered" sentences (every reference
word seen in training), and the test_2016 - test_2017 gap of both; for the first ``--hyps``, sacreBLEU of each
Flickr split by source length (13a tokens), since the two splits' lengths differ.

    python benchmarks/studies/split_gap.py --prepared artifacts/prepared --src en --tgt de \\
        --hyps main=artifacts/eval wu=../wu2/artifacts/eval

Prints Markdown tables. Reads text only: no model, no GFLOP/s (nothing here is timed). The counting and scoring:
``tests/support/split_coverage.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.harness import markdown_table
from benchmarks.tests_support.split_coverage import length_rows, model_rows, split_stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepared", type=Path, default=Path("artifacts/prepared"))
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--hyps", nargs="*", default=[], help="NAME=EVAL_DIR (an artifacts/eval folder)")
    args = ap.parse_args()
    rows, covered = split_stats(args.prepared, args.src, args.tgt)
    print(markdown_table(
        ["split", "sentences", "source tokens / sentence", "reference tokens / sentence",
         "reference tokens unseen in training (%)", "sentences with an unseen word (%)", "reference 4-grams unseen (%)"],
        [[r["split"], r["sentences"], f"{r['src_tokens']:.1f}", f"{r['ref_tokens']:.1f}", f"{r['unseen_tokens']:.2f}",
          f"{r['unseen_sentences']:.1f}", f"{r['unseen_4grams']:.1f}"] for r in rows], "lrrrrrr"))
    if not args.hyps:
        return
    n16, n17 = sum(covered["test_2016_flickr"]), sum(covered["test_2017_flickr"])
    models = []
    for spec in args.hyps:
        name, folder = spec.split("=", 1)
        m = model_rows(name, Path(folder), args.prepared, args.tgt, covered)
        a, b = m["test_2016_flickr"], m["test_2017_flickr"]
        ac, bc = m["test_2016_flickr:covered"], m["test_2017_flickr:covered"]
        models.append([name, f"{a:.2f}", f"{b:.2f}", f"{m.get('test_2017_mscoco', float('nan')):.2f}", f"{a - b:.2f}",
                       f"{ac:.2f}", f"{bc:.2f}", f"{ac - bc:.2f}"])
    print()
    print(markdown_table(["model", "test_2016", "test_2017", "mscoco", "gap 2016-2017", f"test_2016 covered ({n16})",
                          f"test_2017 covered ({n17})", "gap, covered"], models, "lrrrrrrr"))
    name, folder = args.hyps[0].split("=", 1)
    print(f"\n{name}, by source length:\n")
    print(markdown_table(["source tokens", "test_2016 sentences", "BLEU", "test_2017 sentences", "BLEU", "gap"],
                         [[bucket, n_a, f"{a:.2f}", n_b, f"{b:.2f}", f"{a - b:.2f}"]
                          for bucket, n_a, a, n_b, b in length_rows(Path(folder), args.prepared, args.src, args.tgt)],
                         "lrrrrr"))

if __name__ == "__main__":
    main()
