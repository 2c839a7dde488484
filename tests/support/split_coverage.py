"""What each Multi30k test split holds that training did not, and a run's BLEU on the part training covers.

The study logic of ``benchmarks/studies/split_gap.py`` (docs/studies/split-gap.md), kept here because the tests
check it (``tests/test_training_choice.py``). Tokens are sacreBLEU's 13a (the ones BLEU counts): a reference word
absent from the training targets is "unseen"; a sentence is "covered" when every reference word was seen.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sacrebleu.metrics import BLEU
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

__all__ = ["BUCKETS", "TESTS", "length_rows", "model_rows", "split_stats"]

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
