"""Why the Multi30k test sets score apart: what each split holds that training did not, and each model's BLEU on
the part of each split that training covers.

Issue 25 asks for the held-out Flickr sets (test_2016_flickr, test_2017_flickr) within 3 BLEU of each other. This
measures whether that gap is the model's or the data's. For each split of a prepared project (``artifacts/prepared``:
the text the models were trained and scored on) it counts, with sacreBLEU's 13a tokenizer (the one BLEU uses):
sentence lengths; reference tokens whose word never occurs in the training targets ("unseen"); reference 4-grams
never in the training targets. Then, for each ``--hyps`` folder (an ``artifacts/eval`` of a finished run: one
``<split>.hyp.<tgt>`` per test split), sacreBLEU on the whole split and on its "covered" sentences (every reference
word seen in training), and the test_2016 - test_2017 gap of both; for the first ``--hyps``, sacreBLEU of each
Flickr split by source length (13a tokens), since the two splits' lengths differ.

    python benchmarks/split_gap.py --prepared artifacts/prepared --src en --tgt de \\
        --hyps main=artifacts/eval wu=../wu2/artifacts/eval

Prints Markdown tables. Reads text only: no model, no GFLOP/s (nothing here is timed).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

TESTS = ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _ngrams(tokens: list[str], n: int = 4) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def split_stats(prepared: Path, src: str, tgt: str) -> tuple[list[dict], dict[str, list[bool]]]:
    """Per split: sentences, mean source / reference tokens, % reference tokens unseen in the training targets, %
    sentences with one or more, % reference 4-grams unseen; and per split which sentences are fully covered."""
    tok = Tokenizer13a()
    train = [tok(s).split() for s in _lines(prepared / f"train.{tgt}")]
    vocab = {w for s in train for w in s}
    grams = {g for s in train for g in _ngrams(s)}
    rows, covered = [], {}
    for split in TESTS:
        if not (prepared / f"{split}.{tgt}").exists():
            continue
        refs = [tok(s).split() for s in _lines(prepared / f"{split}.{tgt}")]
        srcs = [tok(s).split() for s in _lines(prepared / f"{split}.{src}")]
        unseen = Counter(sum(w not in vocab for w in r) for r in refs)
        n_tok = sum(len(r) for r in refs)
        all_grams = [g for r in refs for g in _ngrams(r)]
        covered[split] = [all(w in vocab for w in r) for r in refs]
        rows.append({
            "split": split, "sentences": len(refs),
            "src_tokens": sum(len(s) for s in srcs) / len(srcs), "ref_tokens": n_tok / len(refs),
            "unseen_tokens": 100 * sum(k * v for k, v in unseen.items()) / n_tok,
            "unseen_sentences": 100 * (1 - unseen[0] / len(refs)),
            "unseen_4grams": 100 * sum(g not in grams for g in all_grams) / max(1, len(all_grams)),
        })
    return rows, covered


def model_rows(name: str, hyps: Path, prepared: Path, tgt: str, covered: dict[str, list[bool]]) -> dict:
    """sacreBLEU of one run's hypotheses on each test split, whole and on its covered sentences."""
    out: dict = {"model": name}
    for split in TESTS[1:]:
        hyp_file = hyps / f"{split}.hyp.{tgt}"
        if not hyp_file.exists():
            continue
        hyp, ref = _lines(hyp_file), _lines(prepared / f"{split}.{tgt}")
        keep = covered[split]
        out[split] = BLEU().corpus_score(hyp, [ref]).score
        out[split + ":covered"] = BLEU().corpus_score([h for h, k in zip(hyp, keep) if k],
                                                      [[r for r, k in zip(ref, keep) if k]]).score
    return out


BUCKETS = ((0, 10), (10, 13), (13, 16), (16, 10_000))


def length_rows(hyps: Path, prepared: Path, src: str, tgt: str) -> list[tuple[str, int, float, float]]:
    """``(bucket, sentences in test_2016, its BLEU, test_2017's BLEU)`` per source-length bucket."""
    tok, out = Tokenizer13a(), []
    text = {split: (_lines(prepared / f"{split}.{src}"), _lines(prepared / f"{split}.{tgt}"),
                    _lines(hyps / f"{split}.hyp.{tgt}")) for split in TESTS[1:3]}
    for lo, hi in BUCKETS:
        row: list = [f"{lo}-{hi - 1}" if hi < 10_000 else f">= {lo}"]
        for split, (srcs, refs, hyp) in text.items():
            keep = [i for i, s in enumerate(srcs) if lo <= len(tok(s).split()) < hi]
            row += [len(keep), BLEU().corpus_score([hyp[i] for i in keep], [[refs[i] for i in keep]]).score]
        out.append(tuple(row))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepared", type=Path, default=Path("artifacts/prepared"))
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--hyps", nargs="*", default=[], help="NAME=EVAL_DIR (an artifacts/eval folder)")
    args = ap.parse_args()
    rows, covered = split_stats(args.prepared, args.src, args.tgt)
    print("| split | sentences | source tokens / sentence | reference tokens / sentence | reference tokens unseen "
          "in training (%) | sentences with an unseen word (%) | reference 4-grams unseen (%) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['split']} | {r['sentences']} | {r['src_tokens']:.1f} | {r['ref_tokens']:.1f} | "
              f"{r['unseen_tokens']:.2f} | {r['unseen_sentences']:.1f} | {r['unseen_4grams']:.1f} |")
    if not args.hyps:
        return
    n16, n17 = sum(covered["test_2016_flickr"]), sum(covered["test_2017_flickr"])
    print(f"\n| model | test_2016 | test_2017 | mscoco | gap 2016-2017 | test_2016 covered ({n16}) | "
          f"test_2017 covered ({n17}) | gap, covered |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in args.hyps:
        name, folder = spec.split("=", 1)
        m = model_rows(name, Path(folder), args.prepared, args.tgt, covered)
        a, b = m["test_2016_flickr"], m["test_2017_flickr"]
        ac, bc = m["test_2016_flickr:covered"], m["test_2017_flickr:covered"]
        print(f"| {name} | {a:.2f} | {b:.2f} | {m.get('test_2017_mscoco', float('nan')):.2f} | {a - b:.2f} | "
              f"{ac:.2f} | {bc:.2f} | {ac - bc:.2f} |")
    name, folder = args.hyps[0].split("=", 1)
    print(f"\n{name}, by source length:\n")
    print("| source tokens | test_2016 sentences | BLEU | test_2017 sentences | BLEU | gap |")
    print("|---|---:|---:|---:|---:|---:|")
    for bucket, n_a, a, n_b, b in length_rows(Path(folder), args.prepared, args.src, args.tgt):
        print(f"| {bucket} | {n_a} | {a:.2f} | {n_b} | {b:.2f} | {a - b:.2f} |")


if __name__ == "__main__":
    main()
