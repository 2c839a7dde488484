"""The model card for people: ``model_card.md``, the same facts as the bundle's ``model_card.json``."""

from __future__ import annotations

import json
from typing import Any

from aiayn.exitcodes import cut_warning_markdown

__all__ = ["render_card"]


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
    lines += ["", "## Provenance", ""]
    prov = card["provenance"]
    if "git_commit" in prov:
        lines.append(f"- git commit: `{prov.get('git_commit')}`" + (" (dirty work tree)" if prov.get("git_dirty") else ""))
    lines += [f"- model seed {prov.get('seed')}, data-order seed {prov.get('data_seed')}; "
              f"weights of steps {prov.get('averaged_steps')} (`train.select`: one, or their average)",
              f"- tokenizer sha256 `{prov.get('tokenizer_sha256')}`"]
    lines += [f"- data `{k}`: `{v}`" for k, v in sorted(prov.get("data_hashes", {}).items())]
    lines += ["", "## Serving", "", f"- runtime `{card['runtime']}`, compute type `{card.get('compute_type')}`",
              f"- decoding: {json.dumps(card['decode'])}",
              f"- why this variant: {card['why']}", "", "## Known limits", ""]
    lines += [f"- {x}" for x in card["limits"]]
    lines += ["", "## Parameters", "", "```json", json.dumps(card["params"], indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)
