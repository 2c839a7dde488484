"""The model card for people: ``model_card.md``, the same facts as the bundle's ``model_card.json``."""

from __future__ import annotations

import json
from typing import Any

from aiayn.exitcodes import cut_warning_markdown

__all__ = ["render_card", "promotion_gate_lines"]


def render_card(card: dict[str, Any]) -> str:
    """The model card as markdown (same facts as ``model_card.json``). Its first line says so when training was cut
    by the clock or a signal (``card["training"]["budget"]``)."""
    training = card.get("training") or {}
    budget = training.get("budget")
    lines = cut_warning_markdown(budget)
    lines += [f"# {card['name']} — {card['variant']}", "",
              f"{card['description']}", ""]
    if budget:
        lines += [f"Training: {budget} (stopped by {training.get('stopped_by')} at step {training.get('step')})."]
        lines += [f"- model choice: {note}" for note in training.get("selection", [])]
        lines += [""]
    lines += ["## Quality (sacreBLEU, detokenized, cased)", "",
              "| test set | BLEU | chrF | BLEU signature |", "|---|---:|---:|---|"]
    for split, s in card["scores"].items():
        lines.append(f"| {split} | {s['bleu']:.2f} | {s['chrf']:.2f} | `{s.get('bleu_signature', '')}` |")
    if card.get("promotion_gate"):
        lines += promotion_gate_lines(card["promotion_gate"])
    lines += ["", "## Provenance", ""]
    prov = card["provenance"]
    if "git_commit" in prov:
        lines.append(f"- git commit: `{prov.get('git_commit')}`" + (" (dirty work tree)" if prov.get("git_dirty") else ""))
    lines += [f"- model seed {prov.get('seed')}, data-order seed {prov.get('data_seed')}; "
              f"weights of steps {prov.get('averaged_steps')} (`train.select`: one, or their average)",
              f"- tokenizer sha256 `{prov.get('tokenizer_sha256')}`"]
    if parent := prov.get("adapted_from"):
        version = f" (version {parent['version']}, registered by run `{parent['run_id']}`)" if parent.get("version") else ""
        lines += [f"- adapted from `{parent['init_from']}`{version} by continued training: its weights (sha256 "
                  f"`{parent['weights_sha256']}`) and tokenizer (`train.init_from`)"]
    lines += [f"- data `{k}`: `{v}`" for k, v in sorted(prov.get("data_hashes", {}).items())]
    lines += ["", "## Serving", "", f"- runtime `{card['runtime']}`, compute type `{card.get('compute_type')}`",
              f"- decoding: {json.dumps(card['decode'])}",
              f"- why this variant: {card['why']}", "", "## Known limits", ""]
    lines += [f"- {x}" for x in card["limits"]]
    lines += ["", "## Parameters", "", "```json", json.dumps(card["params"], indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)


def promotion_gate_lines(gate: dict[str, Any]) -> list[str]:
    """The card's "Promotion gate" section: the decision of ``aiayn.adaptation.promotion_gate.decide`` (with its
    ``summary`` line and the ``models`` compared, when given), every split's BLEU for challenger and parent."""
    new = gate["new_domain"]
    verdict = "promoted to champion" if gate["promote"] else "not promoted: the champion was kept"
    models = gate.get("models") or {}
    lines = ["", "## Promotion gate", "",
             f"Decision: **{verdict}**" + (f" (challenger {models['challenger']}, parent {models['parent']})"
                                            if models.get("challenger") and models.get("parent") else "") + ".",
             f"Rule: gain >= {gate['gain_min']:.2f} BLEU on the new domain ({new['split']}) and a loss <= "
             f"{gate['loss_max']:.2f} BLEU on every old split; both models decoded and scored in the same run.", "",
             "| test set | role | challenger BLEU | parent BLEU | change |", "|---|---|---:|---:|---:|",
             f"| {new['split']} | new domain | {new['challenger']:.2f} | {new['parent']:.2f} | {new['gain']:+.2f} |"]
    lines += [f"| {o['split']} | old | {o['challenger']:.2f} | {o['parent']:.2f} | {-o['loss']:+.2f} |"
              for o in gate["old"]]
    lines += ["", *[f"- {reason}" for reason in gate["reasons"]]]
    lines += [f"- BLEU signature: `{sig}`" for sig in dict.fromkeys(gate.get("signatures", {}).values())]
    return lines
