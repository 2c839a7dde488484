"""The champion history and rollback: who moved a registered model's ``champion`` (or ``challenger``)
alias, when, from which version to which, why and on which numbers; and the move back.

- ``promote(client, name, version, tracking_uri=..., reason=...)``: points the alias at ``version`` under
  the model's registry lock (``aiayn.tracking.registry_lock``) and records the event;
- ``history(client, name)``: every recorded move, oldest first (empty when there is none);
- ``rollback(client, name, tracking_uri=...)``: points ``champion`` back at the previous champion of the
  history (or at ``to_version``); ``ChampionHistoryError`` when there is none or the version does not
  exist, and then nothing changed.

Each registration records its alias move too (``aiayn.tracking.registry``: reason ``registered: ...``).
The events live in the registry: one tag per event on the registered model, ``aiayn.history.<seq>``, and
tags ``aiayn.<alias>_since``, ``_reason``, ``_actor``, ... on the version that took the alias; why tags
and not one list or a run's artifact, and how a writer killed mid-move is repaired by the next one, is
``aiayn.tracking.alias_events``'s module doc. ``actor`` defaults to ``AIAYN_ACTOR``, else
``<user>@<host>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.tracking.alias_events import default_actor, events, pending_intents, record_move, repair, version_metrics
from aiayn.tracking.registry import CHAMPION, RegistryError
from aiayn.tracking.registry_lock import RegistryLockTimeout, model_lock
from aiayn.tracking.store import http_unreachable

__all__ = ["ChampionHistoryError", "open_registry", "current_version", "promote", "history", "previous_champion", "rollback"]

#: Seconds ``history`` waits for the registry lock to write a repair (else it answers with the repair unwritten).
HISTORY_LOCK_WAIT_S = 10.0


class ChampionHistoryError(RegistryError):
    """A promotion or rollback that cannot be made (no earlier champion, no such version): nothing changed."""


def open_registry(tracking_uri: str) -> Any:
    """An ``MlflowClient`` of the registry at ``tracking_uri``; ``RegistryError`` when a server does not answer."""
    if tracking_uri.startswith(("http://", "https://")) and (why := http_unreachable(tracking_uri)):
        raise RegistryError(f"model registry {tracking_uri} unreachable: {why}")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _existing_version(client: Any, name: str, version: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, version)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "INVALID_PARAMETER_VALUE"):
            raise ChampionHistoryError(f"version {version} of registered model {name} does not exist: nothing "
                                       f"changed") from None
        raise


def current_version(client: Any, name: str, alias: str = CHAMPION) -> str | None:
    """The version ``alias`` of ``name`` points at now; None when there is none (or no such model)."""
    from mlflow.exceptions import MlflowException

    try:
        version = (client.get_registered_model(name).aliases or {}).get(alias)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            return None
        raise
    return None if version is None else str(version)


def promote(client: Any, name: str, version: str, *, tracking_uri: str, alias: str = CHAMPION, reason: str,
            metrics: Mapping[str, float] | None = None, run_id: str | None = None,
            actor: str | None = None) -> dict[str, Any]:
    """Point ``alias`` of ``name`` at ``version`` under the model's registry lock and append the event
    (``metrics`` None: the version's ``bleu.*``/``chrf.*`` tags; ``actor`` None: ``AIAYN_ACTOR``, else
    ``<user>@<host>``). Returns the event (a version that holds the alias already is recorded too, from and to
    the same). ``ChampionHistoryError`` for a version that does not exist, ``ValueError`` for an empty reason
    or a non-finite metric: nothing changed then."""
    version = str(version)
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("promote needs a reason (it is recorded in the champion history)")
    with model_lock(client, name, tracking_uri):
        mv = _existing_version(client, name, version)
        return record_move(client, name, version, alias=alias, reason=reason, kind="promote", run_id=run_id,
                           metrics=version_metrics(mv.tags) if metrics is None else metrics,
                           actor=default_actor(actor))


def history(client: Any, name: str, *, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """Every recorded alias move of ``name``, oldest first; ``[]`` when the model or its history is missing.
    An event a killed writer left unfinished is settled (``alias_events``): in the answer, and in the
    registry too when the lock is free within ``HISTORY_LOCK_WAIT_S`` (``tracking_uri`` picks the lock's
    kind; default the client's)."""
    if pending_intents(client, name):
        try:
            with model_lock(client, name, tracking_uri or client.tracking_uri, wait_s=HISTORY_LOCK_WAIT_S):
                repair(client, name)
        except RegistryLockTimeout:
            pass  # a writer holds it: its move is settled in the answer below, and written by it
    return events(client, name)


def previous_champion(moves: Sequence[Mapping[str, Any]], current: str | None) -> str | None:
    """The champion before ``current`` by the history ``moves`` (oldest first), None when there is none.

    The champions that were replaced form a stack: a registration or promotion pushes the version it
    replaced; a rollback to a version on the stack drops it and everything above it (so rolling back
    twice goes two champions back, not back and forth); a rollback elsewhere (``--to``) pushes like a
    promotion. When the alias was moved outside the history, the last recorded champion is the previous."""
    stack: list[str] = []
    last_to = None
    for move in moves:
        if move.get("alias") != CHAMPION:
            continue
        frm, to = move.get("from_version"), str(move.get("to_version"))
        last_to = to
        if move.get("kind") == "rollback" and to in stack:
            del stack[len(stack) - 1 - stack[::-1].index(to):]
        elif frm is not None and str(frm) != to:
            stack.append(str(frm))
    if last_to is not None and current is not None and last_to != current:
        return last_to
    while stack and stack[-1] == current:
        stack.pop()
    return stack[-1] if stack else None


def rollback(client: Any, name: str, *, tracking_uri: str, to_version: str | None = None, actor: str | None = None,
             reason: str | None = None) -> dict[str, Any]:
    """Point ``champion`` of ``name`` back at the previous champion (``previous_champion`` of the history)
    or at ``to_version``, under the registry lock, and append the event (kind ``rollback``, the target's
    ``bleu.*``/``chrf.*`` tags as metrics, its run as ``run_id``). Returns the event.
    ``ChampionHistoryError`` when there is no earlier champion, the target is the champion already, or the
    version does not exist: nothing changed then."""
    with model_lock(client, name, tracking_uri):
        repair(client, name)
        current = current_version(client, name)
        target = str(to_version) if to_version is not None else previous_champion(events(client, name), current)
        if target is None:
            now = f"the champion is version {current}" if current is not None else "it has no champion"
            raise ChampionHistoryError(f"no earlier champion of {name} in its history to roll back to ({now}): "
                                       f"nothing changed")
        if target == current:
            raise ChampionHistoryError(f"version {target} of {name} is the champion already: nothing changed")
        mv = _existing_version(client, name, target)
        why = reason if reason and reason.strip() else f"rollback: champion version {current} -> {target}"
        return record_move(client, name, target, alias=CHAMPION, reason=why, kind="rollback", run_id=mv.run_id or None,
                           metrics=version_metrics(mv.tags), actor=default_actor(actor))
