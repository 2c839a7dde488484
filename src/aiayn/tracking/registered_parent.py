"""A registered version as the parent of a continued training (``train.init_from: models:/NAME@ALIAS`` or
``models:/NAME/VERSION``): resolved to a model folder the train stage can start from.

The version's serving bundle is downloaded and checked against the sha256 manifest registered with it (as
``aiayn serve`` does: ``aiayn.tracking.registry.verify_manifest``). An eager bundle holds the float weights;
a CTranslate2 bundle (the default, ``ct2-int8``) does not, so the float weights are taken from the ``model/``
folder the train stage logged in the pipeline run that registered the version, accepted only when its
``model.json`` and ``spm.model`` are the bundle's bytes. The folder (``model.json``, ``model.safetensors``,
``spm.model`` and ``resolved.json``: URI, name, version, the version's run, where the weights came from) is
kept under ``cache_root`` per name and version (``aiayn.config.finetune.registered_parent_dir``) and not
downloaded again. Every failure is ``RegistryError`` with one line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from aiayn.config.finetune import RESOLVED_FILE, registered_parent_dir, registry_parts
from aiayn.io import atomic_dir, atomic_write_json
from aiayn.tracking.registry import RegistryError, download_verified, registered_version
from aiayn.tracking.store import http_unreachable

__all__ = ["resolve_registered_parent"]

_MODEL_FILES = ("model.json", "spm.model", "model.safetensors")


def resolve_registered_parent(uri: str, *, tracking_uri: str, cache_root: str | Path) -> dict[str, Any]:
    """The model folder of the registered version ``uri`` names (an alias is resolved to its version now), kept
    under ``cache_root``. Returns ``resolved.json``'s fields (``uri`` pinned to the version, ``name``, ``version``,
    ``run_id``: the run that registered it, ``weights_from``) and ``model_dir``. Raises ``RegistryError``
    (unreachable, no such alias or version, a download that does not match its manifest, no float weights)."""
    try:
        name, alias, version = registry_parts(uri)
    except ValueError as e:
        raise RegistryError(str(e)) from None
    if version is None:
        version = registered_version(name, alias, tracking_uri=tracking_uri)
    folder = registered_parent_dir(cache_root, name, version)
    if not (folder / RESOLVED_FILE).is_file():
        _download_parent(name, version, tracking_uri=tracking_uri, cache_root=Path(cache_root), folder=folder)
    return json.loads((folder / RESOLVED_FILE).read_text(encoding="utf-8")) | {"model_dir": str(folder)}


def _download_parent(name: str, version: str, *, tracking_uri: str, cache_root: Path, folder: Path) -> None:
    """Download ``models:/name/version`` and write its model folder at ``folder`` (atomically)."""
    if tracking_uri.startswith(("http://", "https://")) and (why := http_unreachable(tracking_uri)):
        raise RegistryError(f"model registry {tracking_uri} unreachable: {why}")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        mv = client.get_model_version(name, version)
    except Exception as e:  # noqa: BLE001 - one message for every registry failure
        raise RegistryError(f"models:/{name}/{version} not found in {tracking_uri}: "
                            f"{' '.join(str(e).split())[:300]}") from None
    cache_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root, prefix=".download.") as tmp:
        bundle = _bundle(client, mv, tracking_uri, Path(tmp) / "bundle")
        model_dir, weights_from = bundle, "bundle"
        if not (bundle / "model.safetensors").is_file():
            model_dir = _train_run_model(client, mv, bundle, tracking_uri, Path(tmp) / "train")
            weights_from = "train run"
        with atomic_dir(folder) as out:
            for f in _MODEL_FILES:
                shutil.copyfile(model_dir / f, out / f)
            atomic_write_json(out / RESOLVED_FILE, {"uri": f"models:/{name}/{version}", "name": name,
                                                    "version": str(version), "run_id": mv.run_id,
                                                    "weights_from": weights_from})


def _bundle(client: Any, mv: Any, tracking_uri: str, dst: Path) -> Path:
    """The version's serving bundle downloaded into ``dst``, checked against its registered manifest."""
    bundle, _, problems = download_verified(client, mv, tracking_uri=tracking_uri, dst=dst)
    if problems:
        raise RegistryError(f"models:/{mv.name}/{mv.version} refused as a parent: its download does not match the "
                            f"sha256 manifest registered with it: {'; '.join(problems[:5])}")
    return bundle


def _train_run_model(client: Any, mv: Any, bundle: Path, tracking_uri: str, dst: Path) -> Path:
    """The ``model/`` folder a train stage run under the version's run logged, whose ``model.json`` and
    ``spm.model`` are the bundle's (newest first)."""
    import mlflow.artifacts

    experiment = client.get_run(mv.run_id).info.experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{mv.run_id}' and "
                                                          "tags.`aiayn.stage` = 'train'",
                              order_by=["attributes.start_time DESC"])
    want = [(bundle / f).read_bytes() for f in ("model.json", "spm.model")]
    for run in runs:
        try:
            local = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="model",
                                                             dst_path=str(dst / run.info.run_id),
                                                             tracking_uri=tracking_uri))
        except Exception:  # noqa: BLE001 - a run without the folder is not the one
            continue
        if all((local / f).is_file() for f in _MODEL_FILES) and \
                [(local / f).read_bytes() for f in ("model.json", "spm.model")] == want:
            return local
    variant = json.loads((bundle / "bundle.json").read_text(encoding="utf-8")).get("variant")
    raise RegistryError(f"models:/{mv.name}/{mv.version} is a {variant} bundle without float weights, and its "
                        f"pipeline run {mv.run_id} has no train run whose logged model/ folder matches it: continue "
                        "from a model folder (artifacts/model) instead")
