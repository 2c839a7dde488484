"""The MLflow Model Registry side of tracking: the serving bundle as a pyfunc model, versions,
aliases, and what ``aiayn serve`` needs to find and download the champion.

Imported only by the export stage and the service (never by ``aiayn.tracking``, which every stage
imports), and imports mlflow lazily like the rest of the package.

Alias rule (``choose_alias``): a new version becomes ``champion`` when there is no champion yet or
its gate-split BLEU (version tag ``bleu.<split>``) is >= the champion's; a tie moves the alias (the
newer pipeline run, with the newest code and data, wins at equal quality). Otherwise it becomes
``challenger``. A champion without the tag counts as absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.tracking import Tracker, _http_unreachable

__all__ = ["CHAMPION", "CHALLENGER", "choose_alias", "register_translation_model", "RegistryError",
           "translation_pyfunc_class", "save_translation_pyfunc", "registered_version", "download_registered_bundle"]

CHAMPION, CHALLENGER = "champion", "challenger"


def choose_alias(new_bleu: float, champion_bleu: float | None) -> str:
    """``champion`` when there is no champion yet or ``new_bleu >= champion_bleu`` (ties move the
    alias), else ``challenger``."""
    if champion_bleu is None or new_bleu >= champion_bleu:
        return CHAMPION
    return CHALLENGER


def register_translation_model(
    tracker: Tracker, bundle_dir: str | Path, *, name: str, variant: str, gate_split: str, bleu: float,
    example: list[str], provenance: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Log the serving bundle on ``tracker``'s run as an MLflow pyfunc model (``serving_model``),
    register a version of ``name`` and give it an alias by ``choose_alias``.

    ``provenance`` (e.g. the git commit) is merged into the model card of the registered copy only (the
    bundle on disk stays deterministic) and set as version tags. The version carries tags
    ``bleu.<gate_split>``, ``gate_split`` and ``variant``. Returns
    ``{"version", "alias", "champion_bleu_before"}``, or None when tracking is off or MLflow failed
    (the tracker's rule: one warning, the pipeline goes on; the bundle on disk is unaffected).
    """
    if not tracker.active:
        return None
    return tracker._guard(_register, tracker, Path(bundle_dir), name, variant, gate_split, float(bleu), list(example),
                          dict(provenance or {}))


def _register(tracker: Tracker, bundle: Path, name: str, variant: str, gate_split: str, bleu: float,
              example: list[str], provenance: dict[str, Any]) -> dict[str, Any]:
    import json
    import shutil
    import tempfile

    from mlflow.exceptions import MlflowException

    from aiayn.export import render_card

    client, run_id = tracker._client, tracker.run_id
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "bundle"
        shutil.copytree(bundle, copy)
        card = json.loads((copy / "model_card.json").read_text(encoding="utf-8"))
        card["provenance"] = card.get("provenance", {}) | provenance
        (copy / "model_card.json").write_text(json.dumps(card, indent=2, sort_keys=True), encoding="utf-8")
        (copy / "model_card.md").write_text(render_card(card), encoding="utf-8")
        local = Path(tmp) / "serving_model"
        save_translation_pyfunc(copy, local, example=example)
        client.log_artifacts(run_id, str(local), "serving_model")
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = {f"bleu.{gate_split}": repr(bleu), "variant": variant, "gate_split": gate_split} | {
        k: str(v) for k, v in provenance.items()}
    mv = client.create_model_version(name, source=f"runs:/{run_id}/serving_model", run_id=run_id, tags=tags)
    champion_bleu = _alias_bleu(client, name, CHAMPION, gate_split)
    alias = choose_alias(bleu, champion_bleu)
    client.set_registered_model_alias(name, alias, mv.version)
    return {"version": str(mv.version), "alias": alias, "champion_bleu_before": champion_bleu}


class RegistryError(RuntimeError):
    """The model registry cannot be reached, or has no version under the asked alias (one line)."""


def _alias_bleu(client: Any, name: str, alias: str, gate_split: str) -> float | None:
    """BLEU tag of the version ``alias`` points at; None when there is no such alias (or no tag)."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise
    tag = (mv.tags or {}).get(f"bleu.{gate_split}")
    return float(tag) if tag is not None else None


def translation_pyfunc_class() -> type:
    """The ``mlflow.pyfunc.PythonModel`` subclass that serves a bundle (built on demand so that
    importing this module never imports mlflow; cloudpickle stores it by value in the model).

    ``predict(model_input: list[str]) -> list[str]``: MLflow validates the input against the type
    hint (a list of strings; a one-column DataFrame, REST ``inputs``, ``dataframe_split`` and
    ``dataframe_records`` are converted to one) and answers anything else (numbers, nested lists,
    objects) with ``MlflowException(INVALID_PARAMETER_VALUE)``: HTTP 400 in the scoring server.
    Translations come back in input order, one per sentence.
    """
    import mlflow.pyfunc

    class AiaynTranslationModel(mlflow.pyfunc.PythonModel):
        def __getstate__(self) -> dict:  # everything comes from the bundle artifact in load_context
            return {}

        def __setstate__(self, state: dict) -> None:
            pass

        def load_context(self, context):
            import os as _os

            from aiayn.export import load_bundle
            from aiayn.translate import DecodeOptions

            self.translator, self.info = load_bundle(context.artifacts["bundle"],
                                                     threads=int(_os.environ.get("AIAYN_SERVE_THREADS", "1")))
            self.options = DecodeOptions(**self.info["decode"])

        def predict(self, context, model_input, params=None):
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

            from aiayn.export import sentences_from_input

            try:
                sentences = sentences_from_input(model_input)
            except (TypeError, ValueError) as e:
                raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None
            return self.translator.translate(sentences, self.options, long="split")

    return AiaynTranslationModel


def save_translation_pyfunc(bundle: str | Path, path: str | Path, *, example: list[str]) -> Path:
    """Save the bundle as an MLflow pyfunc model directory at ``path``; its signature (string in,
    string out) comes from ``predict``'s type hints, ``example`` is the input example."""
    from importlib.metadata import version as _version

    import mlflow.pyfunc

    reqs = [f"{pkg}=={_version(pkg)}" for pkg in ("mlflow", "torch", "ctranslate2", "sentencepiece", "numpy", "pandas")]
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema

    # an explicit column signature, not type hints: with a type hint MLflow's scoring server accepts only
    # `inputs` payloads and refuses `dataframe_split` / `dataframe_records`
    signature = ModelSignature(inputs=Schema([ColSpec(DataType.string)]), outputs=Schema([ColSpec(DataType.string)]))
    mlflow.pyfunc.save_model(str(path), python_model=translation_pyfunc_class()(), artifacts={"bundle": str(bundle)},
                             signature=signature, input_example=list(example), pip_requirements=reqs)
    return Path(path)


def registered_version(name: str, alias: str, *, tracking_uri: str) -> str:
    """Version number the alias points at now. Raises ``RegistryError`` (unreachable, no such alias)."""
    if tracking_uri.startswith(("http://", "https://")):
        why = _http_unreachable(tracking_uri)
        if why:
            raise RegistryError(f"model registry {tracking_uri} unreachable: {why}")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return str(MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version_by_alias(name, alias).version)
    except MlflowException as e:
        raise RegistryError(f"models:/{name}@{alias} not found in {tracking_uri}: {' '.join(str(e).split())[:300]}") from None


def download_registered_bundle(name: str, alias: str, *, tracking_uri: str, dst: str | Path) -> tuple[str, Path]:
    """``(version, bundle folder)``: the serving bundle of ``models:/name@alias`` downloaded into ``dst``.
    Raises ``RegistryError`` (unreachable, no such alias, no bundle in the model)."""
    version = registered_version(name, alias, tracking_uri=tracking_uri)
    import mlflow.artifacts

    from mlflow import MlflowClient

    try:
        source = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri).get_model_version_download_uri(name, version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst), tracking_uri=tracking_uri))
    except Exception as e:  # noqa: BLE001 - one message for every transport failure
        raise RegistryError(f"could not download models:/{name}/{version}: {type(e).__name__}: {e}") from None
    found = sorted(local.rglob("bundle.json"))
    if not found:
        raise RegistryError(f"models:/{name}/{version} holds no serving bundle (bundle.json)")
    return version, found[0].parent
