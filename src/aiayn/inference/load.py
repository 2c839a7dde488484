"""Loading a model to translate with: a serving bundle -> its decoder, behind the translation rules.

``load(path)`` is the one call: it reads the bundle (``aiayn.inference.artifacts``), builds the decoder of
its runtime (``CT2Decoder`` for CTranslate2, ``EagerDecoder`` over our own search for the eager float
model) and puts ``aiayn.inference.translator.Translator`` in front of it, so the service, the MLflow
pyfunc model and ``aiayn translate`` share one input path (blank, long and unknown input follow the
same rules). ``ServingBundle.load`` is the same without the translator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.inference.artifacts import CT2_FILES, BundleError, ModelBundle, read_bundle_info, read_model_config
from aiayn.inference.runtimes import CT2Decoder, DecodeOptions, Decoder, EagerDecoder
from aiayn.inference.translator import Translator
from aiayn.tokenizer import Tokenizer

__all__ = ["load", "BundlePredictor", "ServingBundle", "sentences_from_input"]


@dataclass(frozen=True)
class ServingBundle:
    """A serving bundle, loaded: its ``decoder`` (``CT2Decoder`` or ``EagerDecoder`` by runtime), the
    ``tokenizer`` and ``info`` (``bundle.json``)."""

    path: Path
    info: dict[str, Any]
    tokenizer: Tokenizer
    decoder: Decoder

    @property
    def options(self) -> DecodeOptions:
        """The decoding options the bundle was evaluated with (``bundle.json`` ``decode``)."""
        return DecodeOptions(**self.info["decode"])

    @property
    def variant(self) -> str:
        return self.info["variant"]

    @classmethod
    def load(cls, path: str | Path, *, device: str = "cpu", threads: int = 1) -> "ServingBundle":
        """Load the bundle in ``path`` onto ``device``.

        ``threads``: CTranslate2 workers (``inter_threads``, one thread each: batches decode in parallel)
        or PyTorch intra-op threads for the eager runtime. Raises ``BundleError`` for a malformed bundle,
        ``CheckpointError`` / ``TokenizerError`` for unreadable weights or tokenizer.
        """
        path = Path(path)
        info = read_bundle_info(path)
        for name in ("model.json", "spm.model"):
            if not (path / name).is_file():
                raise BundleError(f"{path / name} not found: the bundle is incomplete")
        if info["runtime"] == "eager":
            torch.set_num_threads(max(1, threads))
            model = ModelBundle.load(path, device=device)
            return cls(path, info, model.tokenizer, EagerDecoder(model.model))
        missing = [n for n in CT2_FILES if not (path / "ct2" / n).is_file()]
        if missing:
            raise BundleError(f"{path / 'ct2'}: missing {', '.join(missing)} (the bundle is incomplete)")
        cfg = read_model_config(path / "model.json")
        tokenizer = Tokenizer.load(path / "spm.model")
        if tokenizer.vocab_size != cfg.vocab_size:
            raise BundleError(f"{path / 'spm.model'} has {tokenizer.vocab_size} pieces but {path / 'model.json'} "
                              f"says vocab_size={cfg.vocab_size}")
        decoder = CT2Decoder(path / "ct2", tokenizer, max_side_tokens=cfg.max_side_tokens, device=device,
                             compute_type=info.get("compute_type") or "default", inter_threads=max(1, threads))
        return cls(path, info, tokenizer, decoder)


def sentences_from_input(model_input: Any) -> list[str]:
    """Source sentences from what an MLflow pyfunc caller may send: a list/tuple of strings, a pandas
    Series, a one-column DataFrame, or a 1-D numpy array of strings (REST ``inputs``,
    ``dataframe_split`` and ``dataframe_records`` payloads arrive as one of these).

    Raises ``TypeError`` for anything else (numbers, nested lists, several columns), naming the
    first offending item; ``ValueError`` for an empty input.
    """
    import pandas as pd

    if isinstance(model_input, pd.DataFrame):
        if model_input.shape[1] != 1:
            raise TypeError(f"expected one column of source sentences, got {model_input.shape[1]} columns "
                            f"{list(model_input.columns)[:5]}")
        items = model_input.iloc[:, 0].tolist()
    elif isinstance(model_input, pd.Series):
        items = model_input.tolist()
    elif isinstance(model_input, np.ndarray):
        if model_input.ndim != 1:
            raise TypeError(f"expected a 1-D array of source sentences, got shape {model_input.shape}")
        items = model_input.tolist()
    elif isinstance(model_input, (list, tuple)):
        items = list(model_input)
    elif isinstance(model_input, str):
        items = [model_input]
    else:
        raise TypeError(f"expected a list of source sentences (strings), got {type(model_input).__name__}")
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise TypeError(f"input item {i} is {type(x).__name__} ({x!r:.60}), expected a string sentence")
    if not items:
        raise ValueError("no sentences to translate (empty input)")
    return items


class BundlePredictor:
    """A loaded bundle as the MLflow pyfunc model runs it (``aiayn.tracking.translation_pyfunc_class``):
    ``parse`` = ``sentences_from_input`` (``TypeError``/``ValueError`` for bad input), ``translate``
    with the bundle's own decoding options and the ``split`` long-line policy. The service builds
    its ``ServedModel`` from one too. Loading raises what ``aiayn.inference.artifacts.ServingBundle.load`` raises."""

    parse = staticmethod(sentences_from_input)

    def __init__(self, bundle: str | Path, *, threads: int = 1, device: str = "cpu") -> None:
        loaded = ServingBundle.load(bundle, device=device, threads=threads)
        self.info: dict[str, Any] = loaded.info
        self.options: DecodeOptions = loaded.options
        self.translator = Translator(loaded.tokenizer, loaded.decoder)

    def translate(self, sentences: list[str]) -> list[str]:
        return self.translator.translate(sentences, self.options, long="split")


def load(bundle: str | Path, *, threads: int = 1, device: str = "cpu") -> BundlePredictor:
    """The serving bundle in ``bundle``, ready to translate (see ``BundlePredictor``)."""
    return BundlePredictor(bundle, threads=threads, device=device)
