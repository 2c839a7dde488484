"""The MLflow Model Registry: the serving bundle as a pyfunc model, the champion rule, and what
``aiayn serve`` needs to find and download a version.

Registration (``register_translation``, called through a stage run's
``register_translation_model``): the bundle is saved as an MLflow 3 logged model (a pyfunc whose
``predict`` runs the predictor class the export stage passes in; this package never imports
``aiayn.export.bundle``) whose source run is the pipeline run, registered as a new version of the model,
and given an alias by ``choose_alias``. ``register_transformers`` registers the Hugging Face export
(``aiayn.export.hf_marian``) with MLflow's ``transformers`` flavor beside it (opt-in: ``export.mlflow_transformers``).

Under faults (docs/serving.md, "Registry under faults"):

- the version's creation, the champion read, the decision and the alias move run under the model's
  registry lock (``aiayn.tracking.registry_lock``), and the alias is re-read after it is set; the move is
  recorded in the champion history (``aiayn.tracking.champion_history``);
- each version carries an idempotency key (``aiayn.registration_key``: the registering stage run and the
  bundle's content digest ``aiayn.bundle_sha256``), looked up before every create and after it, so a create
  whose response was lost and was retried (by this code or by MLflow's HTTP layer) leaves one version;
- ``if_absent=True`` registers only a bundle no version of the model holds yet (the pipeline's check after
  ``dvc repro``, whose run-cache can skip the export stage);
- the registered bundle's files are listed with their sha256 in ``aiayn_bundle_manifest.json`` beside the
  model's ``MLmodel``, whose own sha256 is the version tag ``aiayn.manifest_sha256``; a download that does
  not match is refused (``RegistryError``) and deleted, never served.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from aiayn.tracking.alias_events import record_move, registration_reason
from aiayn.tracking.registry_lock import model_lock
from aiayn.tracking.store import http_unreachable

__all__ = [
    "CHAMPION",
    "CHALLENGER",
    "BUDGET_CUT_TAG",
    "PROMOTION_GATE_TAG",
    "BUNDLE_SHA256_TAG",
    "REGISTRATION_KEY_TAG",
    "MANIFEST_SHA256_TAG",
    "MANIFEST_FILE",
    "file_manifest",
    "tree_sha256",
    "verify_manifest",
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
#: version tag: the promotion gate decides this version's alias (``aiayn.adaptation``): ``pending`` when the export
#: stage registers a model continued from a parent (``train.init_from``), so it becomes ``challenger`` whatever its
#: BLEU; then ``promoted`` or ``refused`` (``aiayn.tracking.promotion``)
PROMOTION_GATE_TAG = "aiayn.promotion_gate"
#: version tag: sha256 digest of the bundle that was registered (the caller's, e.g. the DVC output's bytes:
#: ``aiayn.export.bundle.bundle_sha256``; else ``tree_sha256`` of the folder registered)
BUNDLE_SHA256_TAG = "aiayn.bundle_sha256"
#: version tag: the idempotency key, sha256 of the registering run id and the bundle digest
REGISTRATION_KEY_TAG = "aiayn.registration_key"
#: version tag: sha256 of the model's ``MANIFEST_FILE`` (kept in the registry database, apart from the artifacts)
MANIFEST_SHA256_TAG = "aiayn.manifest_sha256"
#: beside the saved model's ``MLmodel``: ``{relative path: {"size", "sha256"}}`` of every file of the bundle
MANIFEST_FILE = "aiayn_bundle_manifest.json"
#: tries of one version's creation on a transient error (a lost response, a timeout, a 5xx)
CREATE_ATTEMPTS = 3

log = logging.getLogger("aiayn.tracking")


def choose_alias(new_bleu: float, champion_bleu: float | None, *, budget_cut: str | None = None,
                 gated: bool = False, champion_adapted: bool = False) -> str:
    """The alias a new version gets: ``champion`` when there is no champion yet or
    ``new_bleu >= champion_bleu`` (a tie moves the alias: the newer pipeline run, with the newest code
    and data, wins at equal quality), else ``challenger``. A champion without a BLEU tag counts as absent.
    ``budget_cut`` (the ``train.budget_cut`` tag: ``max_time_s`` or ``signal``): training was cut, so the
    model is not the configured one; it is ``challenger`` whatever its BLEU (never served by default).
    ``gated`` (``PROMOTION_GATE_TAG``): an adapted model, ``challenger`` until the promotion gate decides.
    ``champion_adapted``: the champion was promoted by that gate (adapted to its users' domain, judged on their
    split); a model registered without the gate (a nightly retrain) is ``challenger`` whatever its BLEU on the
    gate split, which cannot see the domain the champion was adapted to (``aiayn registry rollback`` or the gate
    move it)."""
    if budget_cut or gated or champion_adapted:
        return CHALLENGER
    if champion_bleu is None or new_bleu >= champion_bleu:
        return CHAMPION
    return CHALLENGER


class RegistryError(RuntimeError):
    """The model registry cannot be reached, or has no version under the asked alias (one line)."""


def _alias_tags(client: Any, name: str, alias: str) -> dict[str, str] | None:
    """The tags of the version ``alias`` points at; None when there is no such alias."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise
    return dict(mv.tags or {})


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


def file_manifest(folder: str | Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size": bytes, "sha256": hex}}`` of every file under ``folder`` (sorted paths,
    ``/``-separated)."""
    root = Path(folder)
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        out[path.relative_to(root).as_posix()] = {"size": path.stat().st_size, "sha256": digest}
    return out


def _manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")


def tree_sha256(folder: str | Path) -> str:
    """sha256 of ``folder``'s ``file_manifest`` (canonical JSON): its content digest, paths included."""
    return hashlib.sha256(_manifest_bytes(file_manifest(folder))).hexdigest()


def verify_manifest(bundle: Path, manifest_file: Path, manifest_sha256: str) -> list[str]:
    """What in the downloaded ``bundle`` differs from the manifest registered with it (empty: nothing):
    the manifest file itself against its sha256 tag first, then each file's size and sha256, and files
    the manifest does not list."""
    try:
        raw = manifest_file.read_bytes()
    except FileNotFoundError:
        return [f"{MANIFEST_FILE}: missing"]
    if hashlib.sha256(raw).hexdigest() != manifest_sha256:
        return [f"{MANIFEST_FILE}: sha256 differs from the version's tag {MANIFEST_SHA256_TAG}"]
    want, have = json.loads(raw), file_manifest(bundle)
    problems = []
    for rel, entry in want.items():
        got = have.get(rel)
        if got is None:
            problems.append(f"{rel}: missing")
        elif got["size"] != entry["size"]:
            problems.append(f"{rel}: {got['size']} bytes, registered {entry['size']} (sha256 differs: truncated?)")
        elif got["sha256"] != entry["sha256"]:
            problems.append(f"{rel}: sha256 {got['sha256'][:12]}..., registered {entry['sha256'][:12]}...")
    problems += [f"{rel}: not in the manifest" for rel in have if rel not in want]
    return problems


def _find_versions(client: Any, name: str, tag: str, value: str) -> list[Any]:
    """Versions of ``name`` whose tag ``tag`` is ``value``, oldest first."""
    quoted = name.replace("'", "\\'")
    found = client.search_model_versions(f"name = '{quoted}' and tags.`{tag}` = '{value}'")
    return sorted(found, key=lambda mv: int(mv.version))


def _transient(e: Exception) -> bool:
    """A transport failure after which the create may or may not have happened: a timeout, a connection
    error (``requests``' errors are ``OSError``), a server error MLflow reports as such."""
    from mlflow.exceptions import MlflowException

    return isinstance(e, OSError) or (isinstance(e, MlflowException) and e.error_code in (
        "INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"))


@contextlib.contextmanager
def _global_tracking_uri(tracking_uri: str) -> Iterator[None]:
    """Point MLflow's process-global tracking URI at ``tracking_uri`` in the block.

    A version whose source is ``models:/<model_id>`` is linked to its logged model (MLflow's OSS registry
    keeps no model_id column), and MLflow's SQL registry looks that model up through the process-global
    tracking URI, not the client's (its own TODO). MLflow mirrors the global URI into ``MLFLOW_TRACKING_URI``
    and unsets the variable when it restores an unset global, so the variable the process had is put back
    after the block: without that, a process that registers (the pipeline flow's registration check)
    loses its ``MLFLOW_TRACKING_URI``, and its next runs go to the default store."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    env = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        with _use_tracking_uri(tracking_uri):
            yield
    finally:
        if env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env


def _create_version_once(client: Any, *, tracking_uri: str, name: str, key: str, **create: Any) -> Any:
    """The one version of ``name`` carrying idempotency ``key``: looked up before each try (a try whose
    response was lost may have created it), created with the key among its tags (one write), retried on a
    transient error; duplicates a transport-level retry made are deleted (the oldest is kept). Under the
    registry lock, so no other aiayn writer creates or reads it meanwhile."""
    for attempt in range(CREATE_ATTEMPTS):
        if _find_versions(client, name, REGISTRATION_KEY_TAG, key):
            break
        try:
            with _global_tracking_uri(tracking_uri):
                client.create_model_version(name, **create)
            break
        except Exception as e:  # noqa: BLE001 - only transient ones are retried
            if not _transient(e) or attempt == CREATE_ATTEMPTS - 1:
                if _find_versions(client, name, REGISTRATION_KEY_TAG, key):
                    break  # it was created after all
                raise
            log.warning("creating a version of %s failed (%s: %s); retrying", name, type(e).__name__, e)
            time.sleep(0.5 * 2 ** attempt)
    first, *duplicates = _find_versions(client, name, REGISTRATION_KEY_TAG, key)
    for mv in duplicates:
        log.warning("deleting version %s of %s: a duplicate of version %s (a retried create)", mv.version, name,
                    first.version)
        client.delete_model_version(name, mv.version)
    return first


def _move_alias(client: Any, name: str, version: str, *, bleu: float, gate_split: str,
                budget_cut: str | None, run_id: str | None = None, gated: bool = False) -> tuple[str, float | None]:
    """Read the champion, decide by ``choose_alias``, set the alias (a move recorded in the champion
    history: ``aiayn.tracking.alias_events.record_move``), and re-read it: when it no longer points at
    ``version`` (a writer outside the lock moved it), decide again (3 tries).
    Returns ``(alias, champion BLEU before)``."""
    for _ in range(3):
        champion = _alias_tags(client, name, CHAMPION) or {}
        champion_bleu = float(champion[f"bleu.{gate_split}"]) if f"bleu.{gate_split}" in champion else None
        adapted = champion.get(PROMOTION_GATE_TAG) == "promoted"
        alias = choose_alias(bleu, champion_bleu, budget_cut=budget_cut, gated=gated, champion_adapted=adapted)
        reason = (f"registered: challenger, the promotion gate decides; bleu.{gate_split} {bleu:.2f}" if gated else
                  registration_reason(alias, bleu, champion_bleu, gate_split=gate_split, budget_cut=budget_cut,
                                      champion_adapted=adapted))
        record_move(client, name, version, alias=alias, kind="register", run_id=run_id,
                    metrics={f"bleu.{gate_split}": bleu}, reason=reason)
        if str(client.get_model_version_by_alias(name, alias).version) == str(version):
            return alias, champion_bleu
        log.warning("alias %s of %s moved while version %s was being registered: deciding again",
                    alias, name, version)
    raise RegistryError(f"alias {alias} of {name} keeps moving: another writer outside the registry lock")


def _already_registered(client: Any, name: str, bundle_sha256: str) -> dict[str, Any] | None:
    """``register_translation``'s answer for a bundle a version of ``name`` holds already (the oldest), else None."""
    found = _find_versions(client, name, BUNDLE_SHA256_TAG, bundle_sha256)
    if not found:
        return None
    mv = client.get_model_version(name, found[0].version)  # a search over REST leaves the aliases out
    aliases = list(mv.aliases or [])
    return {"version": str(mv.version), "alias": aliases[0] if aliases else None, "champion_bleu_before": None,
            "already_registered": True}


def _log_serving_model(client: Any, *, experiment_id: str, run_id: str, source_run: str, bundle: Path,
                       manifest: bytes, example: list[str], predictor: type, tags: Mapping[str, str], bleu: float,
                       gate_split: str) -> str:
    """The MLflow 3 logged model of ``bundle`` (``serving_model``, ``manifest`` beside its ``MLmodel``), READY,
    listed as an output of ``run_id`` and ``source_run``. Returns its id."""
    from mlflow.entities import LoggedModelOutput

    # an MLflow 3 logged model whose source run is the PIPELINE run (MLflow's runs table fills its Models
    # column from the source run, and the pipeline run is the row reviewers compare), listed as an output
    # of that run and of this export run; then a registry version of it, linked to both
    model = client.create_logged_model(experiment_id, name="serving_model", source_run_id=source_run,
                                       tags=dict(tags) | {"aiayn.export_run_id": run_id}, model_type="translation")
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "serving_model"
        save_translation_pyfunc(bundle, local, example=example, predictor=predictor)
        (local / MANIFEST_FILE).write_bytes(manifest)
        client.log_model_artifacts(model.model_id, str(local))
    # the SERVED variant's score, under its own key: `<split>.bleu` on the pipeline run is evaluate's
    # (the float model's), which the runs table, `dvc metrics show` and the report all show
    client.log_metric(source_run, f"serving.{gate_split}.bleu", bleu, model_id=model.model_id)
    client.finalize_logged_model(model.model_id, "READY")
    for rid in dict.fromkeys((run_id, source_run)):
        client.log_outputs(rid, [LoggedModelOutput(model.model_id, step=0)])
    return model.model_id


def register_translation(client: Any, *, tracking_uri: str, experiment_id: str, run_id: str, parent_run_id: str | None,
                         bundle: Path, name: str, variant: str, gate_split: str, bleu: float, example: list[str],
                         predictor: type, tags: Mapping[str, Any], if_absent: bool = False) -> dict[str, Any]:
    """Log ``bundle`` as an MLflow pyfunc model (``serving_model``) of the pipeline run ``parent_run_id``
    (else of ``run_id``, the export stage's run), register a version of ``name`` and give it an alias by
    ``choose_alias`` (a ``train.budget_cut`` entry in ``tags``: training was cut, ``challenger``). The
    version carries tags ``bleu.<gate_split>``, ``gate_split``, ``variant``, ``tags``, and the fault
    tags of the module doc (a ``BUNDLE_SHA256_TAG`` entry in ``tags`` names the bundle's digest).
    ``if_absent``: when a version of ``name`` holds this bundle digest already, register nothing.
    Returns ``{"version", "alias", "champion_bleu_before"}`` (``"already_registered": True`` and the
    version's alias, or None, when ``if_absent`` found one); MLflow's errors propagate."""
    from mlflow.exceptions import MlflowException

    version_tags = {f"bleu.{gate_split}": repr(bleu), "variant": variant, "gate_split": gate_split} | {
        k: str(v) for k, v in tags.items()}
    digest = version_tags.setdefault(BUNDLE_SHA256_TAG, tree_sha256(bundle))
    key = hashlib.sha256(f"{run_id}\n{name}\n{digest}".encode()).hexdigest()
    manifest = _manifest_bytes(file_manifest(bundle))
    version_tags |= {REGISTRATION_KEY_TAG: key, MANIFEST_SHA256_TAG: hashlib.sha256(manifest).hexdigest()}
    if if_absent and (found := _already_registered(client, name, digest)):
        return found
    source_run = parent_run_id or run_id
    earlier = _find_versions(client, name, REGISTRATION_KEY_TAG, key)  # this run got as far as the version
    model_id = next((mv.source.removeprefix("models:/") for mv in earlier if mv.source.startswith("models:/")), None)
    if model_id is None:
        model_id = _log_serving_model(client, experiment_id=experiment_id, run_id=run_id, source_run=source_run,
                                      bundle=bundle, manifest=manifest, example=example, predictor=predictor,
                                      tags=version_tags, bleu=bleu, gate_split=gate_split)
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    with model_lock(client, name, tracking_uri):
        if if_absent and (found := _already_registered(client, name, digest)):
            return found  # registered meanwhile by a concurrent run
        mv = _create_version_once(client, tracking_uri=tracking_uri, name=name, key=key, source=f"models:/{model_id}",
                                  run_id=source_run, tags=version_tags, model_id=model_id)
        alias, champion_bleu = _move_alias(client, name, str(mv.version), bleu=bleu, gate_split=gate_split,
                                           budget_cut=version_tags.get(BUDGET_CUT_TAG), run_id=source_run,
                                           gated=PROMOTION_GATE_TAG in version_tags)
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


def download_verified(client: Any, mv: Any, *, tracking_uri: str, dst: str | Path) -> tuple[Path, str | None, list[str]]:
    """The artifacts of the model version ``mv`` downloaded into ``dst``: ``(bundle folder, the sha256 of the manifest registered
    with it or None, verify_manifest's problems against it)``. The caller decides what a problem means.
    Raises ``RegistryError`` for a failed download or a model without a serving bundle (``bundle.json``)."""
    import mlflow.artifacts

    name, version = mv.name, mv.version
    expected = (mv.tags or {}).get(MANIFEST_SHA256_TAG)
    try:
        source = client.get_model_version_download_uri(name, version)
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(dst), tracking_uri=tracking_uri))
    except Exception as e:  # noqa: BLE001 - one message for every transport failure
        raise RegistryError(f"could not download models:/{name}/{version}: {type(e).__name__}: {e}") from None
    found = sorted(local.rglob("bundle.json"))
    if not found:
        raise RegistryError(f"models:/{name}/{version} holds no serving bundle (bundle.json)")
    manifest = min(local.rglob(MANIFEST_FILE), key=lambda p: len(p.parts), default=local / MANIFEST_FILE)
    problems = verify_manifest(found[0].parent, manifest, expected) if expected is not None else []
    return found[0].parent, expected, problems


def download_registered_bundle(name: str, alias: str, *, tracking_uri: str, dst: str | Path) -> tuple[str, Path]:
    """``(version, bundle folder)``: the serving bundle of ``models:/name@alias`` downloaded into ``dst`` and
    checked against the sha256 manifest registered with it (``verify_manifest``; a version registered
    before aiayn recorded manifests is served unverified, with a warning). Raises ``RegistryError``
    (unreachable, no such alias, no bundle in the model, a download that does not match: ``dst`` is then
    deleted, nothing of it is served)."""
    version = registered_version(name, alias, tracking_uri=tracking_uri)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        mv = client.get_model_version(name, version)
    except Exception as e:  # noqa: BLE001 - one message for every transport failure
        raise RegistryError(f"could not download models:/{name}/{version}: {type(e).__name__}: {e}") from None
    bundle, expected, problems = download_verified(client, mv, tracking_uri=tracking_uri, dst=dst)
    if expected is None:
        log.warning("models:/%s/%s has no %s tag (registered before aiayn recorded manifests): served unverified",
                    name, version, MANIFEST_SHA256_TAG)
    elif problems:
        shutil.rmtree(dst, ignore_errors=True)
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise RegistryError(f"models:/{name}/{version} refused, not served: its download does not match the sha256 "
                            f"manifest registered with it: {'; '.join(problems[:5])}{more}")
    return version, bundle
