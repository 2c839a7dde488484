"""The ``adapt`` Prefect flow: adapt the champion to its users' domain when the trigger says so, then let the
two-sided promotion gate decide whether the adapted model replaces it.

One run:

1. **Lock**: one adaptation per project at a time (``aiayn.adaptation.trigger.adapt_lock``). A run that finds
   one going ends at once, ``Completed`` (named ``Skipped``), saying so; the deployment
   (``pipelines.deploy``: ``adapt/daily``) also runs at most one at a time and cancels a new one meanwhile.
2. **Trigger** (``adapt.trigger``): the last N drift checks all drifted, or the reviewed corpus grew by K
   pairs since the last adaptation (``.aiayn/adapt_state.json``); otherwise ``Completed``: "no adaptation"
   and why. ``force=True`` adapts anyway.
3. **Preflight**: the champion exists in the registry, the reviewed corpus's folder holds the new domain's
   test split; the validation split and the old test sets are written there from ``artifacts/prepared``
   when missing (``aiayn.adaptation.adapt_plan``).
4. **Adapted pipeline**: ``params.yaml`` gets ``train.init_from: models:/NAME@champion``, the reviewed corpus as
   ``data.corpus`` and the gate's splits as ``data.test_splits`` (comments kept, as ``dvc exp run -S`` edits
   it); the ``pipeline`` flow runs (``dvc repro``: train from the champion, evaluate, quantize, export, which
   registers the model as ``challenger``: ``train.init_from`` is set); then the gate
   (``aiayn.adaptation.gate_run.promotion_gate``). ``params.yaml`` is put back as it was afterwards, whatever
   happened, so the nightly retrain keeps its own config.
5. **State and report**: the state is written (atomically) once the gate decided; a markdown artifact (key
   ``aiayn-adapt-report``) carries the trigger and the gate's table. The run ends ``Completed`` with the
   gate's one line ("promoted: ..." or "champion kept: ..."); ``Failed`` with one line when a step fails (the
   champion is untouched then, and the state too: the next run tries again).

Usage: ``make adapt [PARAMS=...]`` or ``python -m pipelines.adapt_flow [--root DIR] [--force] [--no-push]``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines import apply_project_env

apply_project_env()  # before Prefect is imported: it reads its settings once

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.states import Completed, Failed  # noqa: E402

from aiayn.adaptation.adapt_plan import (PARAMS_BACKUP, AdaptError, adapted_overrides, champion_uri,  # noqa: E402
                                         prepare_corpus, restore_interrupted_adaptation)
from aiayn.adaptation.promotion_gate import GateError  # noqa: E402
from aiayn.adaptation.trigger import (LOCK_FILE, TriggerError, adapt_lock, check_trigger, read_state,  # noqa: E402
                                      reviewed_pairs, utc_now, write_state)
from aiayn.config.checks import load_checked  # noqa: E402
from aiayn.config.schema import ConfigError, registered_model_name  # noqa: E402
from aiayn.config.settings import Settings  # noqa: E402
from aiayn.export.model_card import promotion_gate_lines  # noqa: E402
from aiayn.io import atomic_write_text  # noqa: E402
from aiayn.stages import Layout  # noqa: E402
from aiayn.tracking import RegistryError, registered_version, resolve_tracking_uri, tracking_enabled  # noqa: E402

__all__ = ["adapt", "adapted_params_file", "run_adapted_pipeline", "REPORT_KEY", "main"]

#: Key of the markdown artifact (Prefect UI -> Artifacts).
REPORT_KEY = "aiayn-adapt-report"
#: What a step may fail with: one line each, the flow's Failed message.
_STEP_ERRORS = (AdaptError, ConfigError, GateError, RegistryError, TriggerError, FileNotFoundError)


@contextlib.contextmanager
def adapted_params_file(path: Path, overrides: dict[str, Any]) -> Iterator[None]:
    """``path`` (``params.yaml``) with ``overrides`` (``{"a.b": value}``) in the block, its comments kept (DVC's
    round-trip YAML, as ``dvc exp run -S`` edits it), written atomically; the original text is put back
    (atomically) when the block ends, however it ends."""
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    original = path.read_text(encoding="utf-8")
    backup = path.parent / PARAMS_BACKUP  # first: a run killed from here on leaves the original beside it
    backup.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(backup, original)
    data = parse_yaml_for_update(original, str(path))
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        node[leaf] = value
    atomic_write_text(path, dumps_yaml(data))
    try:
        yield
    finally:
        atomic_write_text(path, original)
        backup.unlink(missing_ok=True)


def run_adapted_pipeline(root: Path, push: bool) -> dict[str, Any]:
    """The ``pipeline`` flow on ``root`` (its ``params.yaml`` adapted); returns its result. Raises
    ``AdaptError`` when it did not complete (a failed stage, training cut by the clock or a signal)."""
    from pipelines.pipeline import pipeline

    state = pipeline(root=str(root), push=push, return_state=True)
    if not state.is_completed():
        raise AdaptError(f"the adapted pipeline did not complete: {state.message}")
    return state.result()


@task(name="adapt-preflight", cache_policy=NO_CACHE, persist_result=False)
def preflight(root: str, params: Any, name: str, tracking_uri: str) -> dict[str, Any]:
    """The champion's version (``RegistryError`` without one) and the splits written into the reviewed
    corpus's folder (``prepare_corpus``)."""
    if not tracking_enabled(True):
        raise RegistryError("adapting needs the model registry (the champion is its parent): tracking is off")
    champion = registered_version(name, "champion", tracking_uri=tracking_uri)
    written = prepare_corpus(params, Path(root), Layout(Path(root)).prepared)
    return {"champion": champion, "written": written}


@task(name="promotion-gate", cache_policy=NO_CACHE, persist_result=False)
def gate_task(root: str, name: str, tracking_uri: str, parent_run_id: str | None) -> dict[str, Any]:
    """``aiayn.adaptation.gate_run.promotion_gate`` on the adapted run (``params.yaml`` adapted)."""
    from aiayn.adaptation.gate_run import promotion_gate

    params = load_checked(Path(root) / "params.yaml", root)
    return promotion_gate(params, Layout(Path(root)), name=name, tracking_uri=tracking_uri,
                          parent_run_id=parent_run_id)


def render_markdown(trigger: str, decision: dict[str, Any]) -> str:
    """The Prefect artifact: the trigger, the gate's one line and its table."""
    lines = ["# Adaptation", "", f"Trigger: {trigger}", "", f"**{decision['summary']}**", *promotion_gate_lines(decision)]
    return "\n".join(lines) + "\n"


@flow(name="adapt", log_prints=True)
def adapt(root: str = ".", push: bool = True, force: bool = False) -> Any:
    """Adapt the champion to the reviewed corpus when the trigger fires (or ``force``), then gate (module doc)."""
    logger = get_run_logger()
    root_path = Path(root).resolve()
    with adapt_lock(root_path) as held:
        if not held:
            message = f"skipped: an adapt run is already going in {root_path} ({LOCK_FILE} is held)"
            logger.warning(message)
            return Completed(name="Skipped", message=message)
        if restore_interrupted_adaptation(root_path, locked=True):
            logger.warning("params.yaml was left adapted by a killed adapt run: put back from %s", PARAMS_BACKUP)
        try:
            return _adapt(root_path, push, force, logger)
        except _STEP_ERRORS as e:
            message = f"adaptation failed, the champion is untouched: {' '.join(str(e).split())}"
            logger.error(message)
            return Failed(message=message)


def _adapt(root: Path, push: bool, force: bool, logger: Any) -> Any:
    from monitoring.drift import drift_dir

    params = load_checked(root / "params.yaml", root)
    layout, state = Layout(root), read_state(root)
    corpus = root / params.adapt.reviewed_corpus
    trigger = check_trigger(params.adapt.trigger, drift_dir=drift_dir(layout), corpus=corpus, state=state)
    if not (trigger.fire or force):
        logger.info("no adaptation: %s", trigger.reason)
        return Completed(message=f"no adaptation: {trigger.reason}")
    reason = trigger.reason if trigger.fire else f"forced ({trigger.reason})"
    logger.info("adapting: %s", reason)
    started, pairs = utc_now(), reviewed_pairs(corpus)
    name = registered_model_name(params.data, Settings.from_env().registered_model_override)
    uri = resolve_tracking_uri(root)
    ready = preflight(str(root), params, name, uri)
    if ready["written"]:
        logger.info("wrote %s into %s from artifacts/prepared", ", ".join(ready["written"]), corpus.parent)
    with adapted_params_file(root / "params.yaml", adapted_overrides(params, init_from=champion_uri(name))):
        result = run_adapted_pipeline(root, push)
        decision = gate_task(str(root), name, uri, result.get("mlflow_run"))
    registry = decision["registry"]
    write_state(root, {"adapted_at": started, "reviewed_pairs": pairs, "trigger": reason,
                       "promoted": decision["promote"], "summary": decision["summary"],
                       "challenger": registry["version"], "champion": registry["champion"]})
    create_markdown_artifact(key=REPORT_KEY, markdown=render_markdown(reason, decision),
                             description=f"adaptation: {decision['summary'][:200]}")
    logger.info("promotion gate: %s", decision["summary"])
    return Completed(message=decision["summary"])


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.adapt_flow [--root DIR] [--force] [--no-push]``: one adapt run; exit 1 if it failed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.adapt_flow", description=adapt.description)
    parser.add_argument("--root", default=".", help="project root (default: current directory)")
    parser.add_argument("--force", action="store_true", help="adapt even when the trigger does not fire")
    parser.add_argument("--no-push", dest="push", action="store_false", help="skip `dvc push` in the adapted run")
    args = parser.parse_args(argv)
    state = adapt(root=args.root, push=args.push, force=args.force, return_state=True)
    print(state.message, file=sys.stdout if state.is_completed() else sys.stderr)
    return 0 if state.is_completed() else 1


if __name__ == "__main__":
    sys.exit(main())
