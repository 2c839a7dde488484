"""A tiny En->De world for tests: a toy parallel corpus, a sentencepiece model trained on it, small
random Transformers and a project folder laid out like the pipeline's (``aiayn.stages.Layout``), with the drift
monitor's reference built on it (``monitored_project``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import save_model
from aiayn.config.schema import MonitorConfig, Params, TokenizerConfig, model_preset
from aiayn.inference.runtimes import DecodeOptions, EagerDecoder
from aiayn.model import Transformer
from aiayn.stages import Layout
from aiayn.tokenizer import EncodedSplit, Tokenizer, save_encoded, train_tokenizer
from aiayn.inference.translator import Translator
from support.services import free_port  # noqa: F401 (tests call tiny.free_port())

WORDS = "a man woman dog cat runs jumps in the park street red blue big small two three children play with ball".split()
GERMAN = dict(zip(WORDS, "ein Mann Frau Hund Katze rennt springt im der Park Strasse rot blau gross klein zwei drei Kinder spielen mit Ball".split()))


def corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` random English word strings and their word-by-word German."""
    rng = random.Random(seed)
    en = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    return en, [" ".join(GERMAN[w] for w in s.split()) for s in en]


def tokenizer(folder: Path) -> Tokenizer:
    """A 120-piece sentencepiece model trained on ``corpus(400, 0)``, written under ``folder``."""
    en, de = corpus(400, 0)
    (folder / "t.txt").write_text("\n".join(en + de) + "\n")
    return Tokenizer.load(train_tokenizer([folder / "t.txt"], folder / "spm", TokenizerConfig(vocab_size=120)))


def model(tok: Tokenizer, **kw) -> Transformer:
    """A small random (seed 0) post-norm Transformer over ``tok``'s vocabulary, in eval mode."""
    torch.manual_seed(0)
    cfg = model_preset("tiny", **{"vocab_size": tok.vocab_size, "d_model": 32, "n_heads": 2, "d_ff": 64, "n_layers": 2,
                                  "max_positions": 320, **kw})
    return Transformer(cfg).eval()


def project(root: Path, tok: Tokenizer, norm: str = "post") -> Layout:
    """Prepared splits (train/val/test_a/test_b) and a model bundle under ``root``; test_a's references
    are the model's own greedy output, so the eager model scores BLEU 100 on it."""
    layout = Layout(root)
    prep = layout.prepared
    prep.mkdir(parents=True)
    for split, (n, seed) in {"train": (64, 10), "val": (16, 11), "test_a": (24, 12), "test_b": (12, 13)}.items():
        en, de = corpus(n, seed)
        (prep / f"{split}.en").write_text("\n".join(en) + "\n")
        (prep / f"{split}.de").write_text("\n".join(de) + "\n")
    m = model(tok, norm=norm)
    layout.model.mkdir(parents=True)
    save_model(layout.model / "model.safetensors", m.state_dict())
    (layout.model / "model.json").write_text(json.dumps({"model": m.cfg.model_dump(mode="json"), "seed": 1, "data_seed": 1}))
    (layout.model / "spm.model").write_bytes(Path(tok.source).read_bytes())
    eager = EagerDecoder(m)
    ids = eager.translate_ids(Translator(tok, eager).encode((prep / "test_a.en").read_text().splitlines()),
                              DecodeOptions(beam_size=1, max_len_b=8))
    (prep / "test_a.de").write_text("\n".join(tok.decode(ids)) + "\n")
    return layout


CARD = {"name": "aiayn-test", "description": "tiny", "why": "test", "scores": {"test_a": {"bleu": 1.0, "chrf": 2.0}},
        "provenance": {}, "params": {}, "limits": ["tiny"]}


def ct2_bundle(root: Path, layout: Layout, tok: Tokenizer, decode: DecodeOptions, name: str = "bundle-ct2") -> Path:
    """A serving bundle (``aiayn.export.bundle``) of ``layout``'s model converted to CTranslate2 float32."""
    from aiayn.inference.artifacts import ModelBundle
    from aiayn.export.bundle import build_bundle
    from aiayn.export.ctranslate2 import AiaynConverter

    model = ModelBundle.load(layout.model, device="cpu").model
    AiaynConverter(model, tok).convert(str(root / f"{name}-ct2"), quantization="float32", force=True)
    return build_bundle(root / name, model_dir=layout.model, variant="ct2-float32", variant_dir=root / f"{name}-ct2",
                        compute_type="float32", decode=decode, card=CARD)


def _write_split(prepared: Path, split: str, en: list[str], de: list[str]) -> None:
    (prepared / f"{split}.en").write_text("\n".join(en) + "\n")
    (prepared / f"{split}.de").write_text("\n".join(de) + "\n")


def monitored_project(root: Path, monitor: MonitorConfig, *, more_train: int = 0, val: int = 0,
                      bundle: DecodeOptions | None = None) -> dict[str, Any]:
    """``project`` under ``root / "project"`` with what the drift monitor needs, and its reference built
    (``monitoring.reference.run`` with ``Params(monitor=monitor)``): the training split tokenized into
    ``layout.tokenized``, after ``corpus(more_train, 21)`` pairs were appended to it; the validation split
    replaced by ``corpus(val, 31)`` when ``val`` (the output reference calibrates on it); with ``bundle``, a
    CTranslate2 serving bundle of the model in ``layout.export`` first (the output reference is then the
    bundle's answers, as in the pipeline). Returns ``{"layout", "tok", "params", "summary"}``."""
    from monitoring.reference import run as build_reference

    (root / "tok").mkdir(parents=True)
    tok = tokenizer(root / "tok")
    layout = project(root / "project", tok)
    prep = layout.prepared
    en, de = (prep / "train.en").read_text().splitlines(), (prep / "train.de").read_text().splitlines()
    if more_train:
        more_en, more_de = corpus(more_train, 21)
        en, de = en + more_en, de + more_de
        _write_split(prep, "train", en, de)
    if val:
        _write_split(prep, "val", *corpus(val, 31))
    layout.tokenized.mkdir(parents=True)
    save_encoded(layout.tokenized, "train", EncodedSplit.from_lists(tok.encode(en), tok.encode(de)))
    (layout.tokenized / "spm.model").write_bytes((layout.model / "spm.model").read_bytes())
    if bundle is not None:
        ct2_bundle(layout.export.parent, layout, tok, bundle, name=layout.export.name)
    params = Params(monitor=monitor)
    summary = build_reference(params, layout)
    return {"layout": layout, "tok": tok, "params": params, "summary": summary}


def length_thresholds(high: float) -> dict[str, dict[str, Any]]:
    """Hand-written output thresholds (``aiayn.quality.calibration.calibrate``'s shape): an answer over ``high``
    times its source's length flags ``length_ratio``; ``copy_rate`` (never above 1) flags none."""
    return {"length_ratio": {"tail": "both", "low": 0.0, "high": high, "n": 100, "flag_rate": 0.02},
            "copy_rate": {"tail": "high", "high": 2.0, "n": 100, "flag_rate": 0.02}}


def card_languages(bundle: Path, src: str = "en", tgt: str = "de") -> Path:
    """``bundle`` with its model card naming the pair (``params.data``), as the export stage's card does (``CARD``
    names none): the service's output-language signal reads ``tgt`` there."""
    card = json.loads((bundle / "model_card.json").read_text())
    card["params"] = {**card.get("params", {}), "data": {"src_lang": src, "tgt_lang": tgt}}
    (bundle / "model_card.json").write_text(json.dumps(card))
    return bundle


def serving_bundle(root: Path, decode: DecodeOptions) -> Path:
    """A ct2 bundle of a fresh tiny model under ``root`` (its tokenizer and project beside it): what the
    serving tests put behind ``aiayn serve``."""
    tok = tokenizer(root)
    return ct2_bundle(root, project(root / "proj", tok), tok, decode)


