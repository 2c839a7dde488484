"""fairseq's Multi30k BLEU (Wu et al. 2021, "Good for Misconceived Reasons"), reproduced as a labelled metric.

Their numbers (e.g. 41.02 on test2016 for the text-only ``transformer_tiny``) are fairseq-generate's BLEU4
over lowercased, Moses-normalised, Moses-tokenized text: the multi30k/dataset repository's
``data/task1/tok/*.lc.norm.tok.*`` files, made by its ``scripts/task1-tokenize.sh`` as
``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L`` (Moses snapshot 3a0631a).
Our models output detokenized, cased text, so the hypotheses go through the same three steps
(``lc_norm_tok``: Python's ``str.lower`` and ``sacremoses``' port of the two Perl scripts, HTML-escaping
included) and BLEU is computed on whitespace tokens (sacreBLEU ``tokenize="none"``).

References: the dataset's own ``lc.norm.tok`` files when ``aiayn fetch --tok-references`` put them in
``data/multi30k/tok/`` (``tok_reference``), else the same three steps applied to our prepared (raw, NFC)
references. Equivalence evidence for the latter: on test_2016_flickr the derived references have
12,103 tokens, exactly fairseq's ``reflen=12103`` in Wu et al.'s published log; sacremoses is a port,
not the Perl snapshot, so rare characters may still tokenize differently. The metric's signature says
which references were used. NOT comparable with sacreBLEU's ``bleu``.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = ["lc_norm_tok", "score_moses", "tok_reference", "fetch_tok_references", "TOK_URL", "TOK_SUFFIX"]

log = logging.getLogger("aiayn")

#: Where multi30k/dataset keeps the tokenized task-1 files (``{split}.lc.norm.tok.{lang}``).
TOK_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/tok"
TOK_SUFFIX = "lc.norm.tok"


def lc_norm_tok(lines: Sequence[str], lang: str) -> list[str]:
    """Lowercase, Moses punctuation normalisation (``-l lang``) and Moses tokenization (HTML-escaped, as
    ``tokenizer.perl`` without ``-no-escape``), one output line per input line."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tok.tokenize(norm.normalize(line.lower()), return_str=True, escape=True) for line in lines]


def tok_reference(raw_dir: Path, split: str, lang: str) -> Path:
    """Where ``fetch_tok_references`` puts the dataset's tokenized reference of ``split`` (it may not exist)."""
    return Path(raw_dir) / "tok" / f"{split}.{TOK_SUFFIX}.{lang}"


def score_moses(hypotheses: Sequence[str], references: Sequence[str], lang: str, *,
                tokenized_references: Sequence[str] | None = None) -> dict:
    """fairseq-style BLEU of detokenized ``hypotheses``: ``{"bleu_moses_lc_tok", "bleu_moses_lc_tok_signature"}``.

    ``tokenized_references``: the dataset's ``lc.norm.tok`` lines; None: ``lc_norm_tok(references)``.
    Raises ``ValueError`` when the numbers of lines differ.
    """
    from importlib.metadata import version

    from sacrebleu.metrics import BLEU

    refs = list(tokenized_references) if tokenized_references is not None else lc_norm_tok(references, lang)
    if len(refs) != len(hypotheses):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(refs)} references")
    bleu = BLEU(tokenize="none", force=True)
    result = bleu.corpus_score(lc_norm_tok(hypotheses, lang), [refs])
    source = "dataset-lc.norm.tok" if tokenized_references is not None else "derived-sacremoses"
    sig = f"{bleu.get_signature()}|lc+norm+tok:sacremoses-{version('sacremoses')}|refs:{source}"
    return {"bleu_moses_lc_tok": result.score, "bleu_moses_lc_tok_signature": sig}


def fetch_tok_references(raw_dir: Path, splits: Sequence[str], langs: Sequence[str], *,
                         base_url: str = TOK_URL) -> list[Path]:
    """Download the dataset's ``{split}.lc.norm.tok.{lang}`` files into ``raw_dir/tok/`` (needs the internet).

    No checksum list is published for them: each file's SHA-256 is written to ``tok/SHA256SUMS`` when it is
    first fetched (trust on first use) and a file already there is kept. Version them with
    ``dvc add data/multi30k`` (they then become part of the raw data). Raises ``OSError`` on a failed download.
    """
    out = Path(raw_dir) / "tok"
    out.mkdir(parents=True, exist_ok=True)
    sums = out / "SHA256SUMS"
    lines = sums.read_text(encoding="utf-8").splitlines() if sums.exists() else []
    paths = []
    for split in splits:
        for lang in langs:
            dest = tok_reference(Path(raw_dir), split, lang)
            if not dest.exists():
                tmp = dest.with_suffix(dest.suffix + ".part")
                urllib.request.urlretrieve(f"{base_url}/{dest.name}", tmp)  # noqa: S310 - a fixed https URL
                tmp.replace(dest)
                lines.append(f"{hashlib.sha256(dest.read_bytes()).hexdigest()}  {dest.name}")
                log.info("fetched %s", dest)
            paths.append(dest)
    sums.write_text("\n".join(sorted(set(lines))) + "\n", encoding="utf-8")
    return paths
