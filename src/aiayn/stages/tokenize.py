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

With ``train.init_from`` (continued training, ``aiayn.init_from``) no model is trained: the parent's
``spm.model`` is copied (its bytes), every split is encoded with it, and ``meta.json`` adds ``"parent"`` (what
``parent.json`` holds: URI, version, source run, sha256 of weights and vocabulary, architecture) and
``"unk_rate"`` per split; above ``train.finetune.warn_unk_rate`` of the training split's pieces unknown it
warns, above ``max_unk_rate`` it refuses (one line). With ``train.finetune.replay_share`` the parent's training
pair (``replay_path``) is encoded as the split ``parent_replay`` (``meta["replay"]``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Params
from aiayn.init_from import (PARENT_FILE, REPLAY_SPLIT, ParentModel, check_architecture, check_unknown_rate,
                             resolve_parent, unknown_rate, write_parent_tokenizer)
from aiayn.faults import fault_point
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

    parent = None
    if params.train.init_from is not None:  # the parent's vocabulary, never a new one
        parent = resolve_parent(params.train.init_from, layout.root, getattr(recorder, "resolve_registered_model", None))
        check_architecture(params.model, parent)
    with atomic_dir(layout.tokenized) as tmp:
        if parent is None:
            train_files = [layout.prepared / f"{data.train_split}.{lang}" for lang in langs]
            model_path = train_tokenizer(train_files, tmp / MODEL_NAME.removesuffix(".model"), params.tokenize)
        else:
            model_path = write_parent_tokenizer(parent, tmp / MODEL_NAME)
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
            fault_point("tokenize.split_encoded")
        if parent is not None:
            _continue_parent(params, layout, parent, tok, tmp, meta)
        atomic_write_json(tmp / "meta.json", meta)
    return meta


def _continue_parent(params: Params, layout: Layout, parent: ParentModel, tok: Tokenizer, tmp: Path,
                     meta: dict) -> None:
    """The parent's part of ``meta`` and ``parent.json``, the unknown-piece rates (the training split's checked
    against ``train.finetune``) and the replayed parent pairs. Raises ``ParentModelError`` above ``max_unk_rate``,
    ``TokenizerError`` when a replay file is missing."""
    d, ft = params.data, params.train.finetune
    meta["parent"] = parent.record()
    meta["unk_rate"] = {split: round(unknown_rate(stats), 6) for split, stats in meta["splits"].items()}
    check_unknown_rate(unknown_rate(meta["splits"][d.train_split]), ft, parent.uri,
                       f"the training split {d.train_split!r}")
    if ft.replay_share > 0:
        prefix = Path(ft.replay_path)
        prefix = prefix if prefix.is_absolute() else layout.root / prefix
        src, tgt = (prefix.with_name(f"{prefix.name}.{lang}") for lang in (d.src_lang, d.tgt_lang))
        lacking = [str(f) for f in (src, tgt) if not f.is_file()]
        if lacking:
            raise TokenizerError(f"train.finetune.replay_path {ft.replay_path!r}: {', '.join(lacking)} not found (the "
                                 "parent's prepared training pair: <prefix>.<src_lang> and <prefix>.<tgt_lang>)")
        stats = _stats(save_encoded(tmp, REPLAY_SPLIT, tok, src, tgt))
        meta["replay"] = stats | {"unk_rate": round(unknown_rate(stats), 6),
                                  "src_sha256": sha256_file(src), "tgt_sha256": sha256_file(tgt)}
    atomic_write_json(tmp / PARENT_FILE, parent.record())


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
