"""The promotion gate's side of the model registry: which version is the challenger, and what the gate's
decision (``aiayn.adaptation.promotion_gate``) does to the registry.

Both outcomes are written on the challenger's version as tags (``aiayn.promotion_gate``: ``promoted`` or
``refused``, the one-line summary, the new domain's gain, the largest old-split loss, the parent version and
the gate's run); a promotion moves ``champion`` through ``aiayn.tracking.champion_history.promote`` (under the
registry lock, recorded in the champion history with the gate's reason and numbers). A refusal moves no
alias: the champion stays where it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiayn.tracking.registry import BUNDLE_SHA256_TAG, CHAMPION, PROMOTION_GATE_TAG, RegistryError

__all__ = ["GATE_ACTOR", "challenger_version", "apply_gate_decision"]

#: The champion history's actor of a gate's promotion.
GATE_ACTOR = "promotion-gate"
#: MLflow keeps at most 5000 characters of a version tag (the registry's column).
_MAX_TAG_CHARS = 4000


def _client(tracking_uri: str) -> Any:
    from aiayn.tracking.champion_history import open_registry

    return open_registry(tracking_uri)


def challenger_version(name: str, bundle_sha256: str, *, tracking_uri: str) -> str:
    """The (oldest) version of ``name`` registered from the bundle whose digest is ``bundle_sha256``
    (``aiayn.export.bundle.bundle_sha256``). Raises ``RegistryError`` when none is."""
    client = _client(tracking_uri)
    quoted = name.replace("'", "\\'")
    found = client.search_model_versions(f"name = '{quoted}' and tags.`{BUNDLE_SHA256_TAG}` = '{bundle_sha256}'")
    if not found:
        raise RegistryError(f"no version of {name} in {tracking_uri} holds the exported bundle (sha256 "
                            f"{bundle_sha256[:12]}...): the export stage registers it; is tracking on?")
    return str(min(int(mv.version) for mv in found))


def _tags(decision: Mapping[str, Any], summary: str, parent_version: str | None, run_id: str | None) -> dict[str, str]:
    tags = {PROMOTION_GATE_TAG: "promoted" if decision["promote"] else "refused",
            "gate.summary": summary[:_MAX_TAG_CHARS], "gate.gain": repr(decision["new_domain"]["gain"]),
            "gate.max_loss": repr(max(o["loss"] for o in decision["old"])),
            "gate.parent_version": str(parent_version)}
    if run_id:
        tags["gate.run_id"] = run_id
    return tags


def apply_gate_decision(decision: Mapping[str, Any], *, name: str, version: str, parent_version: str | None,
                        tracking_uri: str, summary: str, metrics: Mapping[str, float], run_id: str | None = None,
                        ) -> dict[str, Any]:
    """Record ``decision`` on version ``version`` of ``name`` (tags, both outcomes) and, when it promotes, move
    ``champion`` to it with ``champion_history.promote`` (``reason`` = ``summary``, ``metrics`` = the gate's
    numbers, ``run_id`` = the gate's MLflow run). ``parent_version``: the champion the challenger was compared
    with; a champion that moved since is never replaced (``RegistryError``, nothing changed).
    Returns ``{"promoted", "version", "champion_before", "champion", "event"}``."""
    from aiayn.tracking.champion_history import current_version, promote

    client = _client(tracking_uri)
    before = current_version(client, name)
    if before != (None if parent_version is None else str(parent_version)):
        raise RegistryError(f"the champion of {name} moved from version {parent_version} to {before} while the gate "
                            f"ran: nothing changed; run the gate again")
    for key, value in _tags(decision, summary, parent_version, run_id).items():
        client.set_model_version_tag(name, str(version), key, value)
    event = None
    if decision["promote"]:
        event = promote(client, name, str(version), tracking_uri=tracking_uri, alias=CHAMPION, reason=summary,
                        metrics=dict(metrics), run_id=run_id, actor=GATE_ACTOR)
    return {"promoted": bool(decision["promote"]), "version": str(version), "champion_before": before,
            "champion": current_version(client, name), "event": event}
