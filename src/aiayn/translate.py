"""Load a trained model bundle and translate text (used by evaluate, the CLI and serving).

A model bundle is a directory (``artifacts/model`` by default) holding
``model.safetensors`` (averaged weights), ``model.json`` (resolved
``ModelConfig`` and provenance) and ``spm.model`` (the joint tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from aiayn.batching import pad_batch
from aiayn.checkpoint import CheckpointError, load_checkpoint, load_model_weights
from aiayn.config import EOS_ID, ModelConfig
from aiayn.decode import beam_search, greedy_decode
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer

__all__ = ["Translator", "DecodeOptions", "MAX_INPUT_TOKENS"]

#: Longest source sentence accepted (tokens, EOS included); longer input is rejected, not truncated.
MAX_INPUT_TOKENS = 256


@dataclass(frozen=True)
class DecodeOptions:
    """Decoding knobs (defaults: paper Section 6.1). ``beam_size=1`` means greedy."""

    beam_size: int = 4
    len_penalty: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    max_tokens: int = 4000  # source tokens per batch
    use_cache: bool = True  # False: recompute the whole prefix each step (reference path, benchmarks)


class Translator:
    """A model + tokenizer pair ready to translate lists of sentences."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(cls, model_dir: str | Path, *, weights: str | Path | None = None) -> "Translator":
        """Load the bundle in ``model_dir`` (optionally other weights, e.g. a checkpoint's).

        Raises ``FileNotFoundError`` for a missing bundle file and
        ``aiayn.checkpoint.CheckpointError`` for unreadable weights.
        """
        model_dir = Path(model_dir)
        for name in ("model.json", "spm.model"):
            if not (model_dir / name).exists():
                raise FileNotFoundError(f"{model_dir / name} not found: train a model first (`aiayn train` or `dvc repro`)")
        meta = json.loads((model_dir / "model.json").read_text(encoding="utf-8"))
        cfg = ModelConfig(**meta["model"])
        model = Transformer(cfg)
        weights_path = Path(weights) if weights else model_dir / "model.safetensors"
        if weights_path.suffix == ".json":  # a training checkpoint
            state = load_checkpoint(weights_path).model
        else:
            state = load_model_weights(weights_path)
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise CheckpointError(f"weights {weights_path} do not fit the model in {model_dir / 'model.json'}: {e}") from e
        return cls(model, Tokenizer.load(model_dir / "spm.model"))

    def encode(self, sentences: list[str]) -> list[np.ndarray]:
        """Source ids with EOS appended. Raises ``ValueError`` for over-long input (names the line, 1-based)."""
        out = []
        for i, ids in enumerate(self.tokenizer.encode(sentences)):
            if len(ids) + 1 > MAX_INPUT_TOKENS:
                raise ValueError(f"input line {i + 1} has {len(ids) + 1} tokens; the limit is {MAX_INPUT_TOKENS}")
            out.append(np.asarray(ids + [EOS_ID], dtype=np.int64))
        return out

    @torch.inference_mode()
    def translate_ids(
        self,
        sources: list[np.ndarray],
        options: DecodeOptions = DecodeOptions(),
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Decode source id arrays (EOS included); returns output ids in input order.

        Batches are formed from length-sorted sources up to ``options.max_tokens``
        padded source tokens. ``progress(n)`` is called with each batch's size.
        """
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
        results: list[list[int]] = [[] for _ in sources]
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(sources[order[end]]) <= options.max_tokens:
                end += 1
            idx = order[start:end]
            src = pad_batch([sources[i] for i in idx])  # (B, S)
            if options.beam_size == 1:
                hyps = greedy_decode(self.model, src, max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                                     use_cache=options.use_cache)
            else:
                hyps = beam_search(self.model, src, beam_size=options.beam_size, len_penalty=options.len_penalty,
                                   max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                                   use_cache=options.use_cache)
            for i, h in zip(idx, hyps):
                results[i] = list(h)
            if progress:
                progress(len(idx))
            start = end
        return results

    def translate(
        self,
        sentences: Iterable[str],
        options: DecodeOptions = DecodeOptions(),
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Translate detokenized sentences; returns detokenized translations in input order."""
        sentences = list(sentences)
        ids = self.translate_ids(self.encode(sentences), options, progress=progress)
        return self.tokenizer.decode(ids)
