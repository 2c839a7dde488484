"""Validation BLEU during training: decode a fixed sample of the validation split and score it.

The sample is drawn once (``sample_indices``: seeded, sorted, the same for the whole run and for a
resumed one), encoded once by ``aiayn.inference.translator.Translator`` (the one translation path, so the
inputs follow ``aiayn translate``'s rules) and decoded at every validation by ``EagerDecoder`` in
eval mode (greedy by default); the hypotheses are scored by ``aiayn.evaluation.scoring.score`` (sacreBLEU BLEU
and chrF against the prepared references). Decoding draws no random numbers and the model's
training flag is restored afterwards, so a training run's weights do not depend on whether this
runs (tests/test_train.py checks it bit for bit).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from aiayn.inference.runtimes import DecodeOptions, EagerDecoder
from aiayn.evaluation.scoring import score
from aiayn.tokenizer import Tokenizer
from aiayn.inference.translator import PreparedInput, Translator

__all__ = ["sample_indices", "BleuValidator"]


def sample_indices(n: int, size: int | None, seed: int) -> np.ndarray:
    """A fixed sample of ``size`` of ``range(n)`` without replacement, sorted (None or >= n: all of them).

    ``numpy.random.Generator(PCG64(seed))``: its own generator, so no global RNG is touched.
    """
    if size is None or size >= n:
        return np.arange(n)
    return np.sort(np.random.Generator(np.random.PCG64(seed)).choice(n, size=size, replace=False))


class BleuValidator:
    """Scores a model on ``sources`` -> ``references`` (detokenized text, one sentence each).

    Args:
        tokenizer: the model's sentencepiece tokenizer.
        sources, references: the validation split's text (same length).
        options: decoding options (``beam_size=1``: greedy); over-long sources are truncated.
        size, seed: the sample (``sample_indices``).
        tokenize: sacreBLEU's BLEU tokenizer (``aiayn.evaluation.scoring.bleu_tokenizer`` picks it from the target
            language; default 13a).

    Calling it with a model returns ``{"valid_bleu", "valid_chrf"}`` (0-100, sacreBLEU defaults but
    ``tokenize``).
    Raises ``ValueError`` when ``sources`` and ``references`` differ in length or are empty.
    """

    def __init__(self, tokenizer: Tokenizer, sources: Sequence[str], references: Sequence[str],
                 options: DecodeOptions = DecodeOptions(beam_size=1), *, size: int | None = None,
                 seed: int = 0, tokenize: str = "13a") -> None:
        if len(sources) != len(references) or not sources:
            raise ValueError(f"validation BLEU needs as many references as sources (>0), got {len(sources)} "
                             f"sources and {len(references)} references")
        self.indices = sample_indices(len(sources), size, seed)
        self.sources = [sources[i] for i in self.indices]
        self.references = [references[i] for i in self.indices]
        self.tokenizer, self.options, self.tokenize = tokenizer, options, tokenize
        self._prepared: PreparedInput | None = None

    def __len__(self) -> int:
        return len(self.sources)

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        """BLEU and chrF of ``model``'s translations of the sample. The model's training flag is restored."""
        was_training = model.training
        try:
            translator = Translator(self.tokenizer, EagerDecoder(model))  # EagerDecoder puts it in eval mode
            if self._prepared is None:
                self._prepared = translator.prepare(self.sources, self.options, long="truncate")
            hyps = [line for chunk in translator.translate_prepared(self._prepared, self.options) for line in chunk]
        finally:
            model.train(was_training)
        result = score(hyps, self.references, tokenize=self.tokenize)
        return {"valid_bleu": float(result["bleu"]), "valid_chrf": float(result["chrf"])}
