"""Wu et al. 2021's text: the lowercased, Moses-normalised, Moses-tokenized Multi30k corpus, and their BLEU on it.

The study logic of ``benchmarks/studies/wu2021_their_text.py`` (docs/studies/wu2021.md), kept here because the
tests check it (``tests/test_training_choice.py``):

- ``write``: every split of the checksummed raw corpus (read by ``aiayn.data.readers.read_lines``, as the prepare
  stage reads it: validated, NFC) through ``aiayn.evaluation.moses_bleu.lc_norm_tok``, into a ``moses``-layout
  corpus (``{split}.{lang}``) that ``configs/multi30k_wu2021_lctok.yaml`` trains on; with ``theirs`` (the text
  LividWo/Revisit-MMT ships, BPE'd) it counts the lines that differ from theirs once their BPE joins are undone;
- ``score``: their convention exactly as fairseq-generate computes it on such a model: BLEU4 of the (already
  lowercased, tokenized) hypotheses against the lc.norm.tok references on whitespace tokens (sacreBLEU
  ``tokenize="none"``), without a second pass of the tokenizer (it is not idempotent: it escapes ``&apos;`` again).

Both print a Markdown table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["SPLITS", "THEIR_NAMES", "score", "write"]

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
#: Their file names (data/multi30k-en-de in LividWo/Revisit-MMT) for ours.
THEIR_NAMES = {"train": "train", "val": "valid", "test_2016_flickr": "test.2016",
               "test_2017_flickr": "test.2017", "test_2017_mscoco": "test.coco"}


def write(raw: Path, out: Path, langs: tuple[str, str], theirs: Path | None) -> None:
    """Write ``out/{split}.{lang}`` (lc.norm.tok) for every split; count differences from ``theirs``."""
    from aiayn.data.readers import read_lines
    from aiayn.io import atomic_write_text
    from aiayn.evaluation.moses_bleu import lc_norm_tok

    out.mkdir(parents=True, exist_ok=True)
    print("| split | lang | lines | tokens | lines differing from theirs |\n|---|---|---:|---:|---:|")
    for split in SPLITS:
        for lang in langs:
            lines = lc_norm_tok(read_lines(raw / f"{split}.{lang}.gz"), lang)
            atomic_write_text(out / f"{split}.{lang}", "".join(line + "\n" for line in lines))
            differ = "-"
            if theirs is not None:
                text = (theirs / f"{THEIR_NAMES[split]}.{lang}").read_text(encoding="utf-8").splitlines()
                text = [re.sub(r"@@( |$)", "", line) for line in text]
                differ = f"{sum(a != b for a, b in zip(lines, text)) + abs(len(lines) - len(text)):,}"
            tokens = sum(len(line.split()) for line in lines)
            print(f"| {split} | {lang} | {len(lines):,} | {tokens:,} | {differ} |")


def score(root: Path, text: Path) -> None:
    """Their BLEU of ``root``'s evaluate hypotheses against ``text``'s references, one row per test split."""
    from sacrebleu.metrics import BLEU

    stage_scores = json.loads((root / "artifacts" / "eval" / "scores.json").read_text())
    print("| test set | BLEU (their convention: tokenize none, no second tokenizer pass) | sacreBLEU (evaluate stage) |")
    print("|---|---:|---:|")
    signature = ""
    for hyp_path in sorted((root / "artifacts" / "eval").glob("*.hyp.*")):
        split, lang = hyp_path.name.split(".hyp.")
        hyps = hyp_path.read_text(encoding="utf-8").splitlines()
        refs = (text / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
        if len(hyps) != len(refs):
            raise ValueError(f"{split}: {len(hyps)} hypotheses but {len(refs)} references")
        cased = sum(h != h.lower() for h in hyps)
        if cased > len(hyps) // 100:
            raise ValueError(f"{split}: {cased} of {len(hyps)} hypotheses hold capitals: this run did not train on "
                             "lowercased text (score a cased run with evaluate.moses_bleu instead)")
        bleu = BLEU(tokenize="none", force=True)
        result = bleu.corpus_score([" ".join(h.split()) for h in hyps], [refs])
        signature = bleu.get_signature()
        print(f"| {split} | {result.score:.2f} ({result}) | {stage_scores[split]['bleu']:.2f} |")
    print(f"\nsignature: {signature}")
