"""The champion history's records: every move of a registered model's alias (``champion``,
``challenger``) as an event kept in the model registry itself, and the recorded move that writes it
(``record_move``; called under the model's registry lock by ``registry._move_alias`` for a registration
and by ``champion_history.promote``/``rollback``, whose module doc is the user's view).

An event: ``{"alias", "from_version", "to_version", "reason", "metrics", "run_id", "actor", "time",
"kind"}`` (``from_version`` None when the alias was unset; ``time`` UTC ISO 8601; ``kind``
``register``, ``promote`` or ``rollback``).

Where the events live (the same with a SQLite store and an MLflow tracking server):

- **one registered-model tag per event**, ``aiayn.history.<seq>`` (``seq`` 1, 2, ... zero-padded), its
  value the event as JSON with its ``state``. A tag is one row of the registry's database, written in one
  transaction by the API that moves the alias, over SQL and REST alike; ``seq`` is the largest present
  plus one, taken under the registry lock, so two writers never share one. Not one tag holding the whole
  list: the registry's tag column is ``VARCHAR(5000)`` (PostgreSQL enforces it: about 15 events), and
  the list would be rewritten, read-modify-write, on every move. Not a JSON artifact of a run: that
  needs a run to own it and the artifact store (MinIO) besides the database, and an upload replaces
  the file a reader may be reading. An event is kept under ``MAX_EVENT_CHARS``;
- **tags on the version that takes the alias**: ``aiayn.<alias>_since`` (the event's time),
  ``_reason``, ``_actor``, ``_from_version``, ``_run_id``, ``_metrics`` (JSON) and ``_event`` (its
  ``seq``): the move that last gave the version the alias, on the version's page in the MLflow UI.

A move, under the lock: (0) ``repair``: the intents a killed writer left are settled; (1) the event is
written with ``state: intent``; (2) the alias is set (one upsert: it points at the old version or the
new one, never at none); (3) the version's tags; (4) the event is rewritten with ``state: done``. A writer
killed after (1) leaves an intent. The rule that settles it (``_settle``): it is done when the alias
moved, that is when the next event of its alias starts from its version or, with none after it, when the
alias points at its version now; otherwise it is abandoned (kept as a tag, left out of the history). The
next writer applies the rule under the lock and writes the result (and the version tags of a done one);
a reader without the lock applies it to what it returns, so an in-flight move counts from the moment
its alias moved.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import os
import socket
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from aiayn.config.settings import Settings

__all__ = ["EVENT_KEYS", "HISTORY_TAG_PREFIX", "default_actor", "events", "pending_intents", "record_move",
           "registration_reason", "repair", "version_metrics"]

#: The registered model's tag of event ``seq`` is ``HISTORY_TAG_PREFIX + f"{seq:06d}"``.
HISTORY_TAG_PREFIX = "aiayn.history."
#: What an event says (``state`` is kept beside them in the tag, never returned).
EVENT_KEYS = ("alias", "from_version", "to_version", "reason", "metrics", "run_id", "actor", "time", "kind")
KINDS = ("register", "promote", "rollback")
#: An event's JSON stays under this (the registry's tag column holds 5000 characters).
MAX_EVENT_CHARS = 4000
MAX_REASON_CHARS = 1000
INTENT, DONE, ABANDONED = "intent", "done", "abandoned"

#: Called with the name of each step of a recorded move: ``"intent"`` (the intent is written, the alias not
#: moved) and ``"moved"`` (the alias is moved, the event not yet done). None in the product; the crash
#: tests set it in a subprocess that is killed there (tests/support/champion_crash.py).
step_hook: Callable[[str], None] | None = None

log = logging.getLogger("aiayn.tracking")


def default_actor(actor: str | None = None) -> str:
    """``actor``, else ``AIAYN_ACTOR``, else ``<user>@<host>``."""
    if actor:
        return actor
    if configured := Settings.from_env().actor:
        return configured
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):  # no passwd entry (a container's arbitrary uid)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def version_metrics(tags: Mapping[str, str] | None) -> dict[str, float]:
    """The scores among a version's tags (``bleu.<split>``, ``chrf.<split>``): what an event of a move
    that names no metrics records."""
    out = {}
    for key, value in sorted((tags or {}).items()):
        if key.startswith(("bleu.", "chrf.")):
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def registration_reason(alias: str, bleu: float, champion_bleu: float | None, *, gate_split: str,
                        budget_cut: str | None, champion_adapted: bool = False) -> str:
    """Why a registration gave ``alias`` (``registry.choose_alias``'s rule, in words)."""
    score = f"bleu.{gate_split} {bleu:.2f}"
    if budget_cut:
        return f"registered: challenger, training cut ({budget_cut}); {score}"
    if champion_adapted:
        return (f"registered: challenger, the champion was adapted to its users' domain by the promotion gate and "
                f"{score} cannot judge that domain (the gate or `aiayn registry rollback` moves it)")
    if champion_bleu is None:
        return f"registered: {score}, no champion with a bleu.{gate_split} tag"
    relation = ">=" if alias == "champion" else "<"
    return f"registered: {alias}, {score} {relation} champion {champion_bleu:.2f}"


def _model(client: Any, name: str) -> Any | None:
    """The registered model (its tags and aliases), None when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            return None
        raise


def _records(model: Any) -> list[tuple[int, dict[str, Any]]]:
    """``(seq, record)`` of every event tag of ``model``, by ``seq``; a tag that does not parse is skipped
    (a warning)."""
    out = []
    for key, value in ((model.tags or {}) if model is not None else {}).items():
        if not key.startswith(HISTORY_TAG_PREFIX):
            continue
        try:
            seq, record = int(key[len(HISTORY_TAG_PREFIX):]), json.loads(value)
            if not isinstance(record, dict) or record.get("state") not in (INTENT, DONE, ABANDONED):
                raise ValueError("not an event")
        except ValueError as e:
            log.warning("registered model %s: tag %s is no champion-history event (%s): skipped", model.name, key, e)
            continue
        out.append((seq, record))
    return sorted(out, key=lambda item: item[0])


def _settle(records: list[tuple[int, dict[str, Any]]], aliases: Mapping[str, Any]) -> list[tuple[int, dict, str]]:
    """``(seq, record, state)`` with each intent settled by the module doc's rule."""
    out = []
    for i, (seq, record) in enumerate(records):
        state = record["state"]
        if state == INTENT:
            later = next((r for _, r in records[i + 1:] if r.get("alias") == record.get("alias")
                          and r["state"] == DONE), None)
            moved_to = later["from_version"] if later is not None else aliases.get(record.get("alias"))
            state = DONE if moved_to is not None and str(moved_to) == str(record.get("to_version")) else ABANDONED
        out.append((seq, record, state))
    return out


def _public(record: Mapping[str, Any]) -> dict[str, Any]:
    return {key: record.get(key) for key in EVENT_KEYS}


def events(client: Any, name: str) -> list[dict[str, Any]]:
    """Every move of ``name``'s aliases that happened, oldest first (intents settled in the answer only;
    an empty list when the model or its history is missing)."""
    model = _model(client, name)
    if model is None:
        return []
    return [_public(record) for _, record, state in _settle(_records(model), model.aliases or {}) if state == DONE]


def pending_intents(client: Any, name: str) -> int:
    """How many events of ``name`` are still intents (a writer in flight, or one that was killed)."""
    return sum(record["state"] == INTENT for _, record in _records(_model(client, name)))


def _last_seq(model: Any) -> int:
    """The largest ``seq`` of ``model``'s history tags, those that do not parse included (0: none)."""
    seqs = [key[len(HISTORY_TAG_PREFIX):] for key in ((model.tags or {}) if model is not None else {})
            if key.startswith(HISTORY_TAG_PREFIX)]
    return max((int(seq) for seq in seqs if seq.isdigit()), default=0)


def _tag_key(seq: int) -> str:
    return f"{HISTORY_TAG_PREFIX}{seq:06d}"


def _write(client: Any, name: str, seq: int, record: Mapping[str, Any]) -> None:
    client.set_registered_model_tag(name, _tag_key(seq), json.dumps(dict(record), sort_keys=True, allow_nan=False))


def _tag_version(client: Any, name: str, seq: int, event: Mapping[str, Any]) -> None:
    """The version tags of the module doc on the version ``event`` gave its alias (skipped if it was deleted)."""
    from mlflow.exceptions import MlflowException

    prefix = f"aiayn.{event['alias']}_"
    tags = {"since": event["time"], "reason": event["reason"], "actor": event["actor"],
            "from_version": event["from_version"] or "", "run_id": event["run_id"] or "",
            "metrics": json.dumps(event["metrics"] or {}, sort_keys=True), "event": str(seq)}
    try:
        for key, value in tags.items():
            client.set_model_version_tag(name, str(event["to_version"]), prefix + key, str(value))
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            raise
        log.warning("version %s of %s is gone: its %s tags were not written", event["to_version"], name, prefix)


def repair(client: Any, name: str) -> int:
    """Settle the intents of ``name``'s history and write the result (a done one's version tags too).
    The caller holds the model's registry lock, so an intent here is a killed writer's. Returns how many."""
    model = _model(client, name)
    if model is None:
        return 0
    settled = _settle(_records(model), model.aliases or {})
    repaired = 0
    for seq, record, state in settled:
        if record["state"] != INTENT:
            continue
        if state == DONE:
            _tag_version(client, name, seq, record)
        log.warning("champion history of %s: event %d (%s -> version %s) was left unfinished: %s", name, seq,
                    record.get("alias"), record.get("to_version"), "the alias had moved, done" if state == DONE
                    else "the alias had not moved, abandoned")
        _write(client, name, seq, record | {"state": state, "settled": _now()})
        repaired += 1
    return repaired


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _event(alias: str, from_version: str | None, version: str, *, reason: str, metrics: Mapping[str, float] | None,
           run_id: str | None, actor: str | None, kind: str) -> dict[str, Any]:
    """A checked event (``ValueError`` naming what is wrong)."""
    if kind not in KINDS:
        raise ValueError(f"event kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not alias or not isinstance(alias, str):
        raise ValueError(f"alias must be a non-empty string, got {alias!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("a reason is required for an alias move")
    checked = {}
    for key, value in (metrics or {}).items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"metric {key!r} is {number}: only finite numbers are recorded")
        checked[str(key)] = number
    reason = " ".join(reason.split())
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS - 3] + "..."
    event = {"alias": alias, "from_version": None if from_version is None else str(from_version),
             "to_version": str(version), "reason": reason, "metrics": checked, "run_id": run_id,
             "actor": default_actor(actor), "time": _now(), "kind": kind}
    size = len(json.dumps(event | {"state": INTENT, "settled": _now()}))
    if size > MAX_EVENT_CHARS:
        raise ValueError(f"the event is {size} characters as JSON, more than the {MAX_EVENT_CHARS} a registry tag "
                         f"keeps: record fewer metrics")
    return event


def _reached(step: str) -> None:
    if step_hook is not None:
        step_hook(step)


def record_move(client: Any, name: str, version: str, *, alias: str, reason: str,
                metrics: Mapping[str, float] | None = None, run_id: str | None = None, actor: str | None = None,
                kind: str = "promote") -> dict[str, Any]:
    """Point ``alias`` of ``name`` at ``version`` and record the event (the module doc's steps 0-4).
    The caller holds the model's registry lock and has checked that the version exists. Returns the event;
    ``ValueError`` (bad event) before anything is written; MLflow's errors propagate."""
    repair(client, name)
    model = _model(client, name)
    current = (model.aliases or {}).get(alias) if model is not None else None
    event = _event(alias, current, str(version), reason=reason, metrics=metrics, run_id=run_id, actor=actor, kind=kind)
    seq = _last_seq(model) + 1
    _write(client, name, seq, event | {"state": INTENT})
    _reached("intent")
    client.set_registered_model_alias(name, alias, str(version))
    _reached("moved")
    _tag_version(client, name, seq, event)
    _write(client, name, seq, event | {"state": DONE})
    return event
