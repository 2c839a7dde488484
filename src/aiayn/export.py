"""The serving bundle: what leaves the pipeline for a serving team, and its registry hand-off.

A bundle is one self-contained folder (``artifacts/export`` from the ``export`` stage; its layout and
loader: ``aiayn.bundle.ServingBundle``): ``bundle.json`` (variant, runtime, compute type, decoding
options), the trained model's ``model.json`` and ``spm.model``, the model (``ct2/`` for CTranslate2,
``model.safetensors`` for the eager runtime) and the model card (``model_card.json`` data hashes,
seeds, params, variant, BLEU/chrF per test set with their sacreBLEU signatures, known limits;
``model_card.md`` the same facts, for people).

The variant is the first quantize-gate-passing one of ``quantize.serving_preference`` (``ct2-int8``
by default, CPU); when none passed, the eager float model (``aiayn.bundle.EAGER``): a rejected variant
never ships. ``BundlePredictor`` puts ``aiayn.translate.Translator`` in front of the bundle's decoder
whatever the runtime, so the service, the MLflow pyfunc model and ``aiayn translate`` share one input
path (blank, long and unknown input follow the same rules).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.bundle import BUNDLE_FORMAT, CT2_FILES, EAGER, BundleError, ServingBundle
from aiayn.decoders import DecodeOptions
from aiayn.exitcodes import cut_warning_markdown
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text
from aiayn.translate import Translator

__all__ = ["build_bundle", "BundlePredictor", "register_bundle", "render_card", "sentences_from_input"]


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
    its ``ServedModel`` from one too. Loading raises what ``aiayn.bundle.ServingBundle.load`` raises."""

    parse = staticmethod(sentences_from_input)

    def __init__(self, bundle: str | Path, *, threads: int = 1, device: str = "cpu") -> None:
        loaded = ServingBundle.load(bundle, device=device, threads=threads)
        self.info: dict[str, Any] = loaded.info
        self.options: DecodeOptions = loaded.options
        self.translator = Translator(loaded.tokenizer, loaded.decoder)

    def translate(self, sentences: list[str]) -> list[str]:
        return self.translator.translate(sentences, self.options, long="split")


def register_bundle(tracker, bundle: str | Path, *, name: str, variant: str, gate_split: str, bleu: float,
                    example: list[str], provenance: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Register ``bundle`` through ``tracker`` (an ``aiayn.tracking.Tracker``) as a pyfunc model run by
    ``BundlePredictor``. ``provenance`` (e.g. the git commit) goes into the model card of the
    registered copy and into the version's tags, never into ``bundle`` itself (a DVC output: it stays
    deterministic bytes). Returns ``Tracker.register_translation_model``'s result."""
    import tempfile

    provenance = dict(provenance or {})
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "bundle"
        shutil.copytree(bundle, copy)
        card = json.loads((copy / "model_card.json").read_text(encoding="utf-8"))
        card["provenance"] = card.get("provenance", {}) | provenance
        atomic_write_json(copy / "model_card.json", card)
        atomic_write_text(copy / "model_card.md", render_card(card))
        return tracker.register_translation_model(copy, name=name, variant=variant, gate_split=gate_split, bleu=bleu,
                                                  example=example, predictor=BundlePredictor, tags=provenance)


def render_card(card: dict[str, Any]) -> str:
    """The model card as markdown (same facts as ``model_card.json``). Its first line says so when training was cut
    by the clock or a signal (``card["training"]["budget"]``)."""
    training = card.get("training") or {}
    budget = training.get("budget")
    lines = cut_warning_markdown(budget)
    lines += [f"# {card['name']} — {card['variant']}", "",
              f"{card['description']}", ""]
    if budget:
        lines += [f"Training: {budget} (stopped by {training.get('stopped_by')} at step {training.get('step')})."]
        lines += [f"- model choice: {note}" for note in training.get("selection", [])]
        lines += [""]
    lines += ["## Quality (sacreBLEU, detokenized, cased)", "",
              "| test set | BLEU | chrF | BLEU signature |", "|---|---:|---:|---|"]
    for split, s in card["scores"].items():
        lines.append(f"| {split} | {s['bleu']:.2f} | {s['chrf']:.2f} | `{s.get('bleu_signature', '')}` |")
    lines += ["", "## Provenance", ""]
    prov = card["provenance"]
    if "git_commit" in prov:
        lines.append(f"- git commit: `{prov.get('git_commit')}`" + (" (dirty work tree)" if prov.get("git_dirty") else ""))
    lines += [f"- model seed {prov.get('seed')}, data-order seed {prov.get('data_seed')}; "
              f"weights of steps {prov.get('averaged_steps')} (`train.select`: one, or their average)",
              f"- tokenizer sha256 `{prov.get('tokenizer_sha256')}`"]
    lines += [f"- data `{k}`: `{v}`" for k, v in sorted(prov.get("data_hashes", {}).items())]
    lines += ["", "## Serving", "", f"- runtime `{card['runtime']}`, compute type `{card.get('compute_type')}`",
              f"- decoding: {json.dumps(card['decode'])}",
              f"- why this variant: {card['why']}", "", "## Known limits", ""]
    lines += [f"- {x}" for x in card["limits"]]
    lines += ["", "## Parameters", "", "```json", json.dumps(card["params"], indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)


def build_bundle(
    out_dir: str | Path,
    *,
    model_dir: str | Path,
    variant: str,
    variant_dir: str | Path | None,
    compute_type: str | None,
    decode: DecodeOptions,
    card: dict[str, Any],
) -> Path:
    """Write the bundle for ``variant`` into ``out_dir`` (atomically replaced).

    ``variant == EAGER``: the float weights of ``model_dir``; otherwise ``variant_dir`` is the
    quantize stage's CTranslate2 folder for it. ``card``: the model card fields (``render_card``).
    Raises ``BundleError`` when a needed file is missing.
    """
    model_dir = Path(model_dir)
    for name in ("model.json", "spm.model", *(("model.safetensors",) if variant == EAGER else ())):
        if not (model_dir / name).is_file():
            raise BundleError(f"{model_dir / name} not found (run the train stage first)")
    if variant != EAGER:
        if variant_dir is None or any(not (Path(variant_dir) / n).is_file() for n in CT2_FILES):
            raise BundleError(f"{variant_dir}: not a CTranslate2 model folder (run the quantize stage first)")
    info = {"format": BUNDLE_FORMAT, "variant": variant, "runtime": "eager" if variant == EAGER else "ctranslate2",
            "compute_type": None if variant == EAGER else compute_type, "decode": decode.__dict__}
    with atomic_dir(Path(out_dir)) as out:
        for name in ("model.json", "spm.model"):
            shutil.copyfile(model_dir / name, out / name)
        if variant == EAGER:
            shutil.copyfile(model_dir / "model.safetensors", out / "model.safetensors")
        else:
            (out / "ct2").mkdir()
            for name in CT2_FILES:
                shutil.copyfile(Path(variant_dir) / name, out / "ct2" / name)
        atomic_write_json(out / "bundle.json", info)
        full = card | {"variant": variant, "runtime": info["runtime"], "compute_type": info["compute_type"],
                       "decode": info["decode"]}
        atomic_write_json(out / "model_card.json", full)
        atomic_write_text(out / "model_card.md", render_card(full))
    return Path(out_dir)
