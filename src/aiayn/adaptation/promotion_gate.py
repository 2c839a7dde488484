"""The two-sided promotion gate: does an adapted model (the challenger) replace its parent (the champion)?

Pure: scores in, a decision record out. Both sides are scored by the evaluate stage's code on the same
test sets in one run (``aiayn.adaptation.gate_run``); here they are only compared:

- the new domain (``adapt.gate.new_domain_split``): the challenger must GAIN at least ``gain_min`` BLEU;
- every old split (``adapt.gate.old_splits``, the parent's test sets): it may LOSE at most ``loss_max`` BLEU.

Promotion needs both. Scores whose sacreBLEU signatures differ (another tokenizer, casing, sacreBLEU
version) are never compared: ``GateError``. Ties pass (a gain of exactly ``gain_min``, a loss of exactly
``loss_max``); differences are rounded to 4 decimals, as the evaluate stage rounds its scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiayn.recording import BAD_KEY_CHARS

__all__ = ["GateError", "decide", "summary_line", "gate_metrics"]


class GateError(ValueError):
    """The scores cannot be compared (a split missing on one side, different sacreBLEU signatures)."""


def _bleu(scores: Mapping[str, Mapping[str, Any]], split: str, side: str) -> tuple[float, str]:
    entry = scores.get(split)
    if entry is None:
        raise GateError(f"the {side} has no score for test split {split!r} (it has {sorted(scores) or 'none'})")
    if "bleu" not in entry or not entry.get("bleu_signature"):
        raise GateError(f"the {side}'s score of {split!r} lacks its BLEU or its sacreBLEU signature: "
                        "scores without a signature are never compared")
    return round(float(entry["bleu"]), 4), str(entry["bleu_signature"])


def _pair(challenger: Mapping[str, Any], parent: Mapping[str, Any], split: str) -> tuple[float, float, str]:
    ch, ch_sig = _bleu(challenger, split, "challenger")
    pa, pa_sig = _bleu(parent, split, "parent")
    if ch_sig != pa_sig:
        raise GateError(f"BLEU signatures differ on {split}: challenger {ch_sig!r}, parent {pa_sig!r}: the scores "
                        "are not comparable (score both with the same sacreBLEU version and settings)")
    return ch, pa, ch_sig


def decide(challenger: Mapping[str, Mapping[str, Any]], parent: Mapping[str, Mapping[str, Any]], *,
           new_domain_split: str, old_splits: Sequence[str], gain_min: float, loss_max: float) -> dict[str, Any]:
    """The gate's decision on ``challenger`` and ``parent`` scores, each ``{split: {"bleu", "bleu_signature",
    ...}}`` (the evaluate stage's ``scores.json`` entries, ``aiayn.stages.evaluate.score_split``).

    Returns ``{"promote", "reasons", "new_domain": {split, challenger, parent, gain}, "old": [{split,
    challenger, parent, loss}], "gain_min", "loss_max", "signatures": {split: BLEU signature}}``;
    ``reasons`` names every failed condition (the split, its BLEU before and after, the bound), or on
    promotion why it passed. Raises ``GateError`` for a split missing on either side or scores whose
    BLEU signatures differ."""
    if not old_splits:
        raise GateError("no old split to hold the challenger to: adapt.gate.old_splits is empty")
    if new_domain_split in old_splits:
        raise GateError(f"the new domain's split {new_domain_split!r} is also an old split")
    signatures: dict[str, str] = {}
    ch, pa, signatures[new_domain_split] = _pair(challenger, parent, new_domain_split)
    new = {"split": new_domain_split, "challenger": ch, "parent": pa, "gain": round(ch - pa, 4)}
    old = []
    for split in old_splits:
        ch, pa, signatures[split] = _pair(challenger, parent, split)
        old.append({"split": split, "challenger": ch, "parent": pa, "loss": round(pa - ch, 4)})
    reasons = []
    if new["gain"] < gain_min:
        reasons.append(f"{new_domain_split}: gained {new['gain']:+.2f} BLEU ({new['parent']:.2f} -> "
                       f"{new['challenger']:.2f}), needs >= {gain_min:.2f}")
    for o in old:
        if o["loss"] > loss_max:
            reasons.append(f"{o['split']}: lost {o['loss']:.2f} BLEU ({o['parent']:.2f} -> {o['challenger']:.2f}), "
                           f"at most {loss_max:.2f} allowed")
    promote = not reasons
    if promote:
        worst = max(old, key=lambda o: o["loss"])
        reasons.append(f"{new_domain_split}: gained {new['gain']:+.2f} BLEU (>= {gain_min:.2f}); every old split "
                       f"within {loss_max:.2f} BLEU (largest loss {worst['loss']:+.2f} on {worst['split']})")
    return {"promote": promote, "reasons": reasons, "new_domain": new, "old": old, "gain_min": gain_min,
            "loss_max": loss_max, "signatures": signatures}


def summary_line(decision: Mapping[str, Any]) -> str:
    """One line: ``promoted: <why>`` or ``champion kept: <every failed condition>``."""
    head = "promoted" if decision["promote"] else "champion kept"
    return f"{head}: {'; '.join(decision['reasons'])}"


def gate_metrics(decision: Mapping[str, Any]) -> dict[str, float]:
    """The decision's numbers as MLflow metrics: ``gate.promote`` (1/0), ``gate.gain``, ``gate.gain_min``,
    ``gate.loss_max``, ``gate.max_loss`` and per split ``gate.<split>.challenger_bleu`` / ``.parent_bleu`` /
    ``.gain`` (new domain) or ``.loss`` (old splits)."""
    new = decision["new_domain"]
    out = {"gate.promote": float(bool(decision["promote"])), "gate.gain": new["gain"],
           "gate.gain_min": float(decision["gain_min"]), "gate.loss_max": float(decision["loss_max"]),
           "gate.max_loss": max(o["loss"] for o in decision["old"])}
    for entry, delta in ((new, "gain"), *((o, "loss") for o in decision["old"])):
        key = BAD_KEY_CHARS.sub("_", entry["split"])
        out |= {f"gate.{key}.challenger_bleu": entry["challenger"], f"gate.{key}.parent_bleu": entry["parent"],
                f"gate.{key}.{delta}": entry[delta]}
    return {k: float(v) for k, v in out.items()}
