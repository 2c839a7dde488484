"""``tokenize`` stage: prepared text -> joint sentencepiece model + encoded splits.

Trains one sentencepiece model on the prepared train source and target text
(``aiayn.tokenizer.train_tokenizer``, streamed; sampled when ``tokenize.input_sentence_size`` is set),
encodes every split with it chunk by chunk (``aiayn.tokenizer.encode_files``) and writes,
as one atomic directory swap:

``layout.tokenized/spm.model``, ``spm.vocab``
``layout.tokenized/{split}.{src,tgt}.{ids,offsets}.npy``   (``aiayn.tokenizer.save_encoded``)
``layout.tokenized/meta.json``
    ``{"vocab_size", "model_sha256", "special_ids", "splits": {split: {"n",
    "src_tokens", "tgt_tokens", "mean_src_len", "mean_tgt_len", "max_src_len",
    "max_tgt_len", "src_unk", "tgt_unk"}}}``; lengths in tokens, no BOS/EOS.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Params
from aiayn.io import atomic_dir, atomic_write_json, sha256_file
from aiayn.recording import NULL_RECORDER, Recorder
from aiayn.stages import Layout
from aiayn.tokenizer import EncodedSplit, Tokenizer, TokenizerError, encode_files, train_tokenizer

__all__ = ["run", "MODEL_NAME"]

#: ``layout.tokenized / MODEL_NAME`` is the sentencepiece model (``spm.vocab`` beside it).
MODEL_NAME = "spm.model"


def run(params: Params, layout: Layout, recorder: Recorder = NULL_RECORDER) -> dict:
    """Run the stage; return ``meta`` (also written to ``meta.json``). ``recorder`` records nothing of
    this stage (no run of its own: ``meta`` is in ``artifacts/tokenized``).

    Raises ``TokenizerError`` when a prepared file is missing (telling the user
    to run ``aiayn prepare``) or training fails; ``CorpusError`` for malformed text.
    """
    data = params.data
    splits = data.splits
    langs = (data.src_lang, data.tgt_lang)
    missing = [layout.prepared / f"{s}.{lang}" for s in splits for lang in langs
               if not (layout.prepared / f"{s}.{lang}").is_file()]
    if missing:
        raise TokenizerError(f"prepared file(s) missing: {', '.join(map(str, missing))}; run `aiayn prepare` first")

    with atomic_dir(layout.tokenized) as tmp:
        train_files = [layout.prepared / f"{data.train_split}.{lang}" for lang in langs]
        model_path = train_tokenizer(train_files, tmp / MODEL_NAME.removesuffix(".model"), params.tokenize)
        tok = Tokenizer.load(model_path)
        meta: dict = {
            "vocab_size": tok.vocab_size,
            "model_sha256": sha256_file(model_path),
            "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
            "splits": {},
        }
        for split in splits:
            src, tgt = (layout.prepared / f"{split}.{lang}" for lang in langs)
            meta["splits"][split] = _stats(save_encoded(tmp, split, tok, src, tgt))
        atomic_write_json(tmp / "meta.json", meta)
    return meta


def save_encoded(directory: Path, split: str, tok: Tokenizer, src: Path, tgt: Path) -> EncodedSplit:
    """Encode one split's prepared files into ``directory`` (streamed: ``aiayn.tokenizer.encode_files``)."""
    return encode_files(tok, src, tgt, directory, split)


def _stats(enc: EncodedSplit) -> dict:
    out: dict = {"n": len(enc)}
    for side in ("src", "tgt"):
        ids, lengths = getattr(enc, f"{side}_ids"), getattr(enc, f"{side}_lengths")
        out[f"{side}_tokens"] = int(lengths.sum())
        out[f"mean_{side}_len"] = round(float(lengths.mean()), 4) if len(enc) else 0.0
        out[f"max_{side}_len"] = int(lengths.max()) if len(enc) else 0
        out[f"{side}_unk"] = int(np.count_nonzero(ids == UNK_ID))
    return out
