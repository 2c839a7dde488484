"""Where the served model comes from: a bundle folder, or a registry alias (``models:/NAME@ALIAS``) whose
version is downloaded, loaded and, when the alias moves, swapped in by the service's poller."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from aiayn.serving.config import ServeConfig

__all__ = ["ServedModel", "load_served_model", "load_model", "parse_model_uri", "registry_uri"]


@dataclass
class ServedModel:
    """A loaded bundle and what the responses say about it."""

    translator: Translator
    options: DecodeOptions
    name: str
    version: str
    variant: str
    card: dict[str, Any] = field(default_factory=dict)
    download_dir: Path | None = None  # registry download (deleted once another version is served)
    #: SHA-256 of the bundle's ``bundle.json`` and (an eager bundle) ``model.safetensors``: what an output
    #: reference names as the model it calibrated (``aiayn.serving.output_flags``)
    digests: frozenset[str] = frozenset()
    #: the output thresholds that count this model's flagged answers (``None``: not counted)
    output_thresholds: dict[str, Any] | None = None

    @property
    def target_lang(self) -> str | None:
        """The language the model translates into (the model card's ``params.data.tgt_lang``), if known."""
        return ((self.card.get("params") or {}).get("data") or {}).get("tgt_lang")

    @property
    def public(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "variant": self.variant}


def load_served_model(bundle: Path, *, version: str, threads: int) -> ServedModel:
    from aiayn.inference.load import BundlePredictor

    from aiayn.io import sha256_file

    p = BundlePredictor(bundle, threads=threads)
    card_path = Path(bundle) / "model_card.json"
    card = json.loads(card_path.read_text(encoding="utf-8")) if card_path.is_file() else {}
    digests = frozenset(sha256_file(Path(bundle) / name) for name in ("bundle.json", "model.safetensors")
                        if (Path(bundle) / name).is_file())
    return ServedModel(p.translator, p.options, card.get("name", "aiayn"), version, p.info["variant"], card,
                       digests=digests)


def registry_uri(cfg: ServeConfig) -> str:
    """The tracking module's rule: ``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ./mlflow.db."""
    from aiayn.tracking import resolve_tracking_uri

    return resolve_tracking_uri(Path(".").resolve(), cfg.tracking_uri)


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME@ALIAS`` -> (name, alias, None); ``models:/NAME/VERSION`` -> (name, None, version)."""
    if not uri.startswith("models:/"):
        raise ValueError(f"model URI must look like models:/NAME@ALIAS or models:/NAME/VERSION, got {uri!r}")
    rest = uri[len("models:/"):]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, alias, None
    name, _, version = rest.partition("/")
    if not name or not version:
        raise ValueError(f"model URI must look like models:/NAME@ALIAS or models:/NAME/VERSION, got {uri!r}")
    return name, None, version


def load_model(cfg: ServeConfig, tmp_dir: str | Path) -> ServedModel:
    """The model ``cfg`` names: its ``bundle`` folder, else the version its ``model_uri`` alias points at,
    downloaded into a fresh folder under ``tmp_dir`` (``ServedModel.download_dir``)."""
    if cfg.bundle is not None:
        return load_served_model(cfg.bundle, version="local", threads=cfg.threads)
    from aiayn.tracking import download_registered_bundle

    name, alias, version = parse_model_uri(cfg.model_uri)
    dst = Path(tmp_dir) / uuid.uuid4().hex
    if alias is None:
        raise ValueError("models:/NAME/VERSION is not supported yet: use models:/NAME@ALIAS or --bundle")
    ver, bundle = download_registered_bundle(name, alias, tracking_uri=registry_uri(cfg), dst=dst)
    m = load_served_model(bundle, version=ver, threads=cfg.threads)
    return replace(m, name=name, download_dir=dst)
