"""Per-sentence descriptors and encoder embeddings of source text: what the drift monitor compares.

Both the reference (training source side) and a window of production inputs go through the same
two functions, so a difference between them is a difference in the text, not in the code:

- ``describe(sentences, tokenizer, source_side)``: one row per sentence, the columns of
  ``DESCRIPTORS`` (numbers, float64);
- ``encoder_embeddings(translator, sentences)``: the trained encoder's output averaged over the
  sentence's source positions, ``(n, d_model)`` float32, then ``Pca.transform`` to
  ``embedding_dims`` components fitted on the reference.

Text is cleaned as ``aiayn translate`` cleans it (``aiayn.inference.text.clean_line``, whitespace runs
collapsed) and normalised as the tokenizer normalises it (``Tokenizer.normalize``: NFKC for our
models), so the monitor sees what the model sees: the same sentence in NFD and NFC gets the same
descriptors (a decomposed accent is not a non-letter character). No Evidently here: this module is cheap to
import and pure (numpy, sentencepiece through ``aiayn.tokenizer``, torch for the encoder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aiayn.config.schema import EOS_ID, UNK_ID
from aiayn.inference.text import clean_line

__all__ = ["DESCRIPTORS", "DESCRIPTOR_DOCS", "clean", "describe", "source_side_table", "encoder_embeddings", "Pca"]

#: Descriptor -> what it measures (units). The order is the report's.
DESCRIPTOR_DOCS: dict[str, str] = {
    "chars": "length in characters (after cleaning and the tokenizer's normalisation)",
    "words": "whitespace-separated words",
    "pieces": "sentencepiece pieces (the model's tokens, EOS not counted)",
    "pieces_per_word": "pieces / words: rises for words the tokenizer did not learn (other language, noise)",
    "unk_rate": "share of pieces that are <unk> (characters the tokenizer never saw)",
    "non_letter_share": "share of non-space characters that are not letters",
    "digit_share": "share of non-space characters that are digits",
    "upper_share": "share of letters that are upper-case",
    "src_lang_score": "share of pieces seen mostly on the source side of the training corpus (source language)",
}
DESCRIPTORS: tuple[str, ...] = tuple(DESCRIPTOR_DOCS)


def clean(sentences: Sequence[str]) -> list[str]:
    """The text the model reads: ``clean_line`` (control characters -> spaces), whitespace runs collapsed."""
    return [" ".join(clean_line(s).split()) for s in sentences]


def _share(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(len(num), dtype=np.float64), where=den > 0)


def describe(sentences: Sequence[str], tokenizer, source_side: np.ndarray) -> dict[str, np.ndarray]:
    """Descriptors of ``sentences``: ``{name: (n,) float64}`` for every name in ``DESCRIPTORS``.

    ``tokenizer``: ``aiayn.tokenizer.Tokenizer`` (the model's); ``source_side``: ``(vocab_size,)``
    bool from ``source_side_table``. A blank sentence gets 0 for every descriptor (no NaN: a
    statistical test must see every row). Raises ``ValueError`` when ``source_side`` does not fit
    the tokenizer.
    """
    if source_side.shape != (tokenizer.vocab_size,):
        raise ValueError(f"source_side has shape {source_side.shape}, the tokenizer has {tokenizer.vocab_size} pieces")
    texts = tokenizer.normalize(clean(sentences))
    ids = tokenizer.encode(texts)
    n = len(texts)
    chars = np.fromiter((len(t) for t in texts), dtype=np.float64, count=n)
    words = np.fromiter((len(t.split()) for t in texts), dtype=np.float64, count=n)
    pieces = np.fromiter((len(x) for x in ids), dtype=np.float64, count=n)
    unk = np.fromiter((sum(1 for i in x if i == UNK_ID) for x in ids), dtype=np.float64, count=n)
    src = np.fromiter((int(source_side[np.asarray(x, dtype=np.int64)].sum()) if x else 0 for x in ids),
                      dtype=np.float64, count=n)
    visible = np.fromiter((sum(1 for c in t if not c.isspace()) for t in texts), dtype=np.float64, count=n)
    letters = np.fromiter((sum(1 for c in t if c.isalpha()) for t in texts), dtype=np.float64, count=n)
    digits = np.fromiter((sum(1 for c in t if c.isdigit()) for t in texts), dtype=np.float64, count=n)
    upper = np.fromiter((sum(1 for c in t if c.isupper()) for t in texts), dtype=np.float64, count=n)
    out = {
        "chars": chars,
        "words": words,
        "pieces": pieces,
        "pieces_per_word": _share(pieces, words),
        "unk_rate": _share(unk, pieces),
        "non_letter_share": _share(visible - letters, visible),
        "digit_share": _share(digits, visible),
        "upper_share": _share(upper, letters),
        "src_lang_score": _share(src, pieces),
    }
    assert tuple(out) == DESCRIPTORS
    return out


def source_side_table(src_ids: np.ndarray, tgt_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """``(vocab_size,)`` bool: piece ``i`` occurs more often in the training source than in the target.

    ``src_ids``/``tgt_ids``: every token id of the training split's source / target side, flat
    (as ``aiayn.tokenizer.EncodedSplit`` stores them). Counts are normalised by each side's total,
    so a longer target side does not claim shared pieces. A piece seen on neither side is not
    source-side. Special ids (pad, unk, bos, eos) are never source-side.
    """
    src = np.bincount(src_ids.astype(np.int64), minlength=vocab_size)[:vocab_size].astype(np.float64)
    tgt = np.bincount(tgt_ids.astype(np.int64), minlength=vocab_size)[:vocab_size].astype(np.float64)
    src_f = src / max(src.sum(), 1.0)
    tgt_f = tgt / max(tgt.sum(), 1.0)
    side = src_f > tgt_f
    side[: EOS_ID + 1] = False
    return side


def encoder_embeddings(translator, sentences: Sequence[str], *, batch_tokens: int = 8000) -> np.ndarray:
    """Mean-pooled encoder output of each sentence: ``(n, d_model)`` float32.

    ``translator``: ``aiayn.inference.translator.Translator`` over an ``aiayn.inference.runtimes.EagerDecoder`` (the trained
    model, any device; ``Translator.from_dir``). Each sentence is
    prepared as the model translates it (cleaned, unknown characters dropped, EOS appended; a line
    longer than the model accepts is truncated to its limit); a blank sentence is EOS alone. The
    encoder output ``(B, S, d_model)`` (Vaswani et al. 2017, Section 3.1) is averaged over the
    non-pad positions. Batches hold at most ``batch_tokens`` padded source tokens, sorted by
    length (``aiayn.inference.runtimes.sorted_batches``, as decoding batches them); results come back in input
    order. Deterministic for a given machine and thread count.
    """
    import logging

    import torch

    from aiayn.data.batching import pad_batch
    from aiayn.inference.runtimes import sorted_batches

    n = len(sentences)
    model = translator.decoder.model
    out = np.zeros((n, model.cfg.d_model), dtype=np.float32)
    if n == 0:
        return out
    quiet = logging.getLogger("aiayn.inference.translator")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # per-line truncation warnings: the descriptors report long input
    try:
        prep = translator.prepare(list(sentences), long="truncate")
    finally:
        quiet.setLevel(level)
    units = [prep.units[a] if b > a else np.asarray([EOS_ID], dtype=np.int64) for a, b in prep.spans]
    device = translator.device
    with torch.inference_mode():
        for idx in sorted_batches(units, max_tokens=batch_tokens):
            src = pad_batch([units[i] for i in idx]).to(device)  # (B, S)
            memory, pad = model.encode(src)  # (B, S, d_model), (B, S) True = pad
            keep = (~pad).unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
            pooled = (memory * keep).sum(1) / keep.sum(1).clamp_min(1.0)  # (B, d_model)
            out[idx] = pooled.float().cpu().numpy()
    return out


@dataclass(frozen=True)
class Pca:
    """PCA fitted on the reference embeddings: ``transform(x) = (x - mean) @ components.T``.

    ``mean`` ``(d,)`` and ``components`` ``(k, d)`` float32 (scikit-learn's full SVD, signs fixed
    by its ``svd_flip``: the same data gives the same components).
    """

    mean: np.ndarray
    components: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray, k: int) -> "Pca":
        """Fit ``k`` components on ``x`` ``(n, d)``. Raises ``ValueError`` when ``k > min(n, d)``."""
        from sklearn.decomposition import PCA

        if k > min(x.shape):
            raise ValueError(f"{k} PCA components asked from {x.shape[0]} embeddings of {x.shape[1]} dims")
        pca = PCA(n_components=k, svd_solver="full").fit(x.astype(np.float64))
        return cls(pca.mean_.astype(np.float32), pca.components_.astype(np.float32))

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``(n, d)`` -> ``(n, k)`` float32. Raises ``ValueError`` on a dimension mismatch."""
        if x.ndim != 2 or x.shape[1] != self.mean.shape[0]:
            raise ValueError(f"embeddings of shape {x.shape} do not fit a PCA of {self.mean.shape[0]} dims")
        return ((x - self.mean) @ self.components.T).astype(np.float32)
