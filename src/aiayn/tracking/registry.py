"""The MLflow Model Registry: the serving bundle as a pyfunc model, the champion rule, and what
``aiayn serve`` needs to find and download a version.

Registration (``register_translation``, called through a stage run's
``register_translation_model``): the bundle is saved as an MLflow 3 logged model (a pyfunc whose
``predict`` runs the predictor class the export stage passes in; this package never imports
``aiayn.export.bundle``) whose source run is the pipeline run, registered as a new version of the model,
and given an alias by ``choose_alias``. ``register_transformers`` registers the Hugging Face export
(``aiayn.export.hf_marian``) with MLflow's ``transformers`` flavor beside it (opt-in: ``export.mlflow_transformers``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiayn.tracking.store import http_unreachable

__all__ = [
    "CHAMPION",
    "CHALLENGER",
    "BUDGET_CUT_TAG",
    "choose_alias",
    "RegistryError",
    "translation_pyfunc_class",
    "PYFUNC_CODE_FILE",
    "PYFUNC_REQUIREMENTS",
    "pinned_requirements",
    "pyfunc_code",
    "save_translation_pyfunc",
    "register_translation",
    "register_transformers",
    "registered_version",
    "download_registered_bundle",
]

CHAMPION, CHALLENGER = "champion", "challenger"
#: version tag (and train stage run tag) naming why training was cut: ``max_time_s`` or ``signal``
BUDGET_CUT_TAG = "train.budget_cut"


def choose_alias(new_bleu: float, champion_bleu: float | None, *, budget_cut: str | None = None) -> str:
    """The alias a new version gets: ``champion`` when there is no champion yet or
    ``new_bleu >= champion_bleu`` (a tie moves the alias: the newer pipeline run, with the newest code
    and data, wins at equal quality), else ``challenger``. A champion without a BLEU tag counts as absent.
    ``budget_cut`` (the ``train.budget_cut`` tag: ``max_time_s`` or ``signal``): training was cut, so the
    model is not the configured one; it is ``challenger`` whatever its BLEU (never served by default)."""
    if budget_cut:
        return CHALLENGER
    if champion_bleu is None or new_bleu >= champion_bleu:
        return CHAMPION
    return CHALLENGER


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


def translation_pyfunc_class(predictor: type) -> type:
    """The ``mlflow.pyfunc.PythonModel`` subclass that serves a bundle with ``predictor`` (built on
    demand so that importing this module never imports mlflow; the saved model names it in its code file,
    ``pyfunc_code``, and carries the ``aiayn`` package it imports in its ``code/`` folder).

    ``predict(context, model_input)``: ``predictor.parse`` turns what MLflow passes (a list, or the
    one-column DataFrame its string-column schema makes of REST ``inputs``, ``dataframe_split`` and
    ``dataframe_records``) into sentences; a ``TypeError``/``ValueError`` there becomes
    ``MlflowException(INVALID_PARAMETER_VALUE)``, HTTP 400 in the scoring server. Translations come
    back in input order, one per sentence. Threads: ``AIAYN_SERVE_THREADS`` of the serving process.
    """
    import mlflow.pyfunc
    import pandas as pd

    class AiaynTranslationModel(mlflow.pyfunc.PythonModel):
        def load_context(self, context):
            from aiayn.config.settings import Settings

            self.predictor = predictor(context.artifacts["bundle"], threads=Settings.from_env().serve_threads)

        # the hint is what MLflow passes under the saved string-column signature (a list becomes a one-column
        # DataFrame); MLflow infers no schema from a DataFrame hint, so the scoring server keeps taking
        # `dataframe_split` / `dataframe_records`, and it stops warning "Add type hints to the `predict` method"
        def predict(self, context, model_input: pd.DataFrame, params=None):
            from mlflow.exceptions import MlflowException
            from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

            try:
                sentences = self.predictor.parse(model_input)
            except (TypeError, ValueError) as e:
                raise MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE) from None
            return self.predictor.translate(sentences)

        # this module's annotations are strings (`from __future__ import annotations`), which MLflow cannot
        # resolve: give it the type itself before PythonModel.__init_subclass__ reads it
        predict.__annotations__["model_input"] = pd.DataFrame

    return AiaynTranslationModel


#: The model's code file in the saved model (MLflow's "models from code": the model is this text, not a pickle).
PYFUNC_CODE_FILE = "aiayn_translation_model.py"


def pyfunc_code(predictor: type) -> str:
    """The text of the saved model's code file: MLflow runs it at load time and serves the object it
    passes to ``mlflow.models.set_model``. Raises ``ValueError`` for a ``predictor`` no import can
    reach (defined in a function, or in ``__main__``)."""
    module, name = predictor.__module__, predictor.__qualname__
    if module == "__main__" or "<" in name:
        raise ValueError(f"predictor {module}.{name} cannot be imported by name: define it at a module's top level")
    return (f'"""aiayn\'s translation model for MLflow ("models from code"): MLflow runs this file when it loads\n'
            f'the model; the weights are the `bundle` artifact, the aiayn package it imports the model\'s code/\n'
            f'folder."""\n\n'
            f"import mlflow.models\n\n"
            f"from aiayn.tracking.registry import translation_pyfunc_class\n"
            f"from {module} import {name} as predictor\n\n"
            f"mlflow.models.set_model(translation_pyfunc_class(predictor)())\n")


#: What loading and running the pyfunc imports beyond the standard library and the ``aiayn`` copy in its
#: ``code/`` folder (pinned to this environment's public versions; pip brings their own dependencies).
PYFUNC_REQUIREMENTS = ("mlflow", "torch", "ctranslate2", "sentencepiece", "numpy", "pandas", "safetensors", "pydantic",
                       "pyyaml")


def pinned_requirements(packages: tuple[str, ...] | list[str]) -> list[str]:
    """``pkg==<version>`` for each installed package, at its public version: a local label (torch's ``+cpu``)
    names a wheel only this project's index has, and pip against PyPI finds no ``torch==2.13.0+cpu``.
    Raises ``importlib.metadata.PackageNotFoundError`` for a package not installed."""
    from importlib.metadata import version

    from packaging.version import Version

    return [f"{pkg}=={Version(version(pkg)).public}" for pkg in packages]


def save_translation_pyfunc(bundle: str | Path, path: str | Path, *, example: list[str], predictor: type) -> Path:
    """Save the bundle as an MLflow pyfunc model directory at ``path``: the model as code (``pyfunc_code``,
    as MLflow 3 recommends over a CloudPickle of the object), the ``aiayn`` package as its ``code_paths``
    (so ``mlflow models serve`` and ``mlflow.pyfunc.load_model`` work in an environment built from the
    model's ``requirements.txt``, ``PYFUNC_REQUIREMENTS`` at this environment's versions; aiayn is not on
    PyPI), an explicit string-column signature (string in, string out) and ``example`` as the input example."""
    import shutil

    import mlflow.pyfunc
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema

    import aiayn

    reqs = pinned_requirements(PYFUNC_REQUIREMENTS)
    # an explicit column signature, not one inferred from a type hint: with a schema-bearing hint (``list[str]``)
    # MLflow's scoring server accepts only `inputs` payloads and refuses `dataframe_split` / `dataframe_records`
    signature = ModelSignature(inputs=Schema([ColSpec(DataType.string)]), outputs=Schema([ColSpec(DataType.string)]))
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / PYFUNC_CODE_FILE
        code.write_text(pyfunc_code(predictor), encoding="utf-8")
        package = Path(tmp) / "aiayn"  # the sources only: no bytecode of this interpreter
        shutil.copytree(Path(aiayn.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        mlflow.pyfunc.save_model(str(path), python_model=str(code), artifacts={"bundle": str(bundle)},
                                 signature=signature, input_example=list(example), pip_requirements=reqs,
                                 code_paths=[str(package)])
    return Path(path)


def register_translation(client: Any, *, tracking_uri: str, experiment_id: str, run_id: str, parent_run_id: str | None,
                         bundle: Path, name: str, variant: str, gate_split: str, bleu: float, example: list[str],
                         predictor: type, tags: Mapping[str, Any]) -> dict[str, Any]:
    """Log ``bundle`` as an MLflow pyfunc model (``serving_model``) of the pipeline run ``parent_run_id``
    (else of ``run_id``, the export stage's run), register a version of ``name`` and give it an alias by
    ``choose_alias`` (a ``train.budget_cut`` entry in ``tags``: training was cut, ``challenger``). The
    version carries tags ``bleu.<gate_split>``, ``gate_split``, ``variant`` and ``tags``. Returns
    ``{"version", "alias", "champion_bleu_before"}``; MLflow's errors propagate."""
    from mlflow.entities import LoggedModelOutput
    from mlflow.exceptions import MlflowException

    version_tags = {f"bleu.{gate_split}": repr(bleu), "variant": variant, "gate_split": gate_split} | {
        k: str(v) for k, v in tags.items()}
    # an MLflow 3 logged model whose source run is the PIPELINE run (MLflow's runs table fills its Models
    # column from the source run, and the pipeline run is the row reviewers compare), listed as an output
    # of that run and of this export run; then a registry version of it, linked to both
    source_run = parent_run_id or run_id
    model = client.create_logged_model(experiment_id, name="serving_model", source_run_id=source_run,
                                       tags=version_tags | {"aiayn.export_run_id": run_id}, model_type="translation")
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "serving_model"
        save_translation_pyfunc(bundle, local, example=example, predictor=predictor)
        client.log_model_artifacts(model.model_id, str(local))
    # the SERVED variant's score, under its own key: `<split>.bleu` on the pipeline run is evaluate's
    # (the float model's), which the runs table, `dvc metrics show` and the report all show
    client.log_metric(source_run, f"serving.{gate_split}.bleu", bleu, model_id=model.model_id)
    client.finalize_logged_model(model.model_id, "READY")
    for rid in dict.fromkeys((run_id, parent_run_id)):
        client.log_outputs(rid, [LoggedModelOutput(model.model_id, step=0)])
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    # source models:/<model_id> is what links the version to the logged model (MLflow's OSS registry keeps
    # no model_id column). For such a source MLflow's SQL registry looks the model up through the
    # process-global tracking URI, not this client's (its own TODO), so point that at ours meanwhile.
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(tracking_uri):
        mv = client.create_model_version(name, source=f"models:/{model.model_id}", run_id=source_run,
                                         tags=version_tags, model_id=model.model_id)
    champion_bleu = _alias_bleu(client, name, CHAMPION, gate_split)
    alias = choose_alias(bleu, champion_bleu, budget_cut=version_tags.get(BUDGET_CUT_TAG))
    client.set_registered_model_alias(name, alias, mv.version)
    return {"version": str(mv.version), "alias": alias, "champion_bleu_before": champion_bleu}


def register_transformers(client: Any, *, run_id: str, hf_dir: Path, name: str, alias: str | None, task: str,
                          example: list[str]) -> str:
    """Save the Hugging Face folder ``hf_dir`` with MLflow's ``transformers`` flavor (a ``task`` pipeline,
    e.g. ``translation_en_to_de``; the folder is stored as a checkpoint path, nothing is loaded), log it
    on run ``run_id`` under ``registered/<name>``, register a version of ``name`` and point ``alias`` at
    it, so ``mlflow models serve -m models:/<name>@<alias>`` serves it with MLflow's stock server.
    Returns the version; MLflow's errors propagate."""
    import mlflow.transformers
    from mlflow.exceptions import MlflowException

    reqs = pinned_requirements(("mlflow", "transformers", "tokenizers", "torch", "sentencepiece"))
    artifact_path = f"registered/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "transformers_model"
        mlflow.transformers.save_model(str(hf_dir), str(local), task=task, input_example=list(example),
                                       pip_requirements=reqs)
        client.log_artifacts(run_id, str(local), artifact_path)
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = client.create_model_version(name, source=f"runs:/{run_id}/{artifact_path}", run_id=run_id)
    if alias:
        client.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)


def registered_version(name: str, alias: str, *, tracking_uri: str) -> str:
    """Version number the alias points at now. Raises ``RegistryError`` (unreachable, no such alias)."""
    if tracking_uri.startswith(("http://", "https://")):
        why = http_unreachable(tracking_uri)
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
