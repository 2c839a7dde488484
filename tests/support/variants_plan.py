"""The seed-variance / variants study's plan: which runs, with which settings, and the statistics of its report.

The study logic of ``benchmarks/studies/variants_study.py`` (docs/studies/seed-variance-and-variants.md), kept here
because the tests check it (``tests/test_variants_study.py``):

- ``VARIANTS`` over ``PAPER`` (the paper's architecture in the fields the variants change), ``model_overrides``
  (a variant's ``model.*`` settings and the ``d_ff`` that keeps its parameters within 1 % of the paper model's),
  ``variant_config`` (its validated ``ModelConfig``);
- ``plan`` (one run per seed, data seed and variant, the paper run shared), ``extend`` (a study's saved plan grown
  by a new one), ``set_flag`` (a ``dvc exp run -S`` argument), ``threads_per_job``;
- ``stats``, ``noise_verdict``, ``join_longer_than`` (the length-extrapolation inputs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PAPER", "ROOT", "VARIANTS", "base_model", "extend", "join_longer_than", "model_overrides", "noise_verdict",
           "plan", "set_flag", "stats", "threads_per_job", "variant_config"]

#: The repository root (this file is ``<root>/tests/support/variants_plan.py``): its ``params.yaml`` is the base.
ROOT = Path(__file__).resolve().parents[2]

#: The paper's architecture (ModelConfig's defaults) in the fields the variants change: every run sets them, so the
#: baseline stays the paper's whatever params.yaml's ``model:`` picks (the main job's is pre-norm with rotary positions).
PAPER: dict[str, Any] = {"model.positions": "sinusoidal", "model.norm": "post", "model.norm_type": "layernorm",
                         "model.activation": "relu", "model.n_kv_heads": None, "model.arch": "encoder_decoder"}
VARIANTS: dict[str, dict[str, Any]] = {
    "paper": {},
    # A learned table costs max_positions x d_model per embedding: 256 positions cover training (<= 52
    # tokens) and the long inputs (source and output); the default 1024 would take 17 % of the FFN.
    "learned": {"model.positions": "learned", "model.max_positions": 256},
    "rope": {"model.positions": "rope"},
    "alibi": {"model.positions": "alibi"},
    "gqa": {"model.n_kv_heads": 2},
    "mqa": {"model.n_kv_heads": 1},
    "swiglu": {"model.activation": "swiglu"},
    "prenorm": {"model.norm": "pre"},
    "rmsnorm": {"model.norm": "pre", "model.norm_type": "rmsnorm"},
    "decoder_only": {"model.arch": "decoder_only"},
}


@functools.lru_cache(maxsize=1)
def base_model() -> tuple[Any, int]:
    """The project's resolved ``model`` config and the tokenizer's vocabulary size (params.yaml)."""
    from aiayn.config.schema import load_params

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return load_params(ROOT / "params.yaml").model, raw["tokenize"]["vocab_size"]


def variant_config(overrides: dict[str, Any], **fields: Any):
    """The ``ModelConfig`` of a variant: params.yaml's model with the vocabulary size, the ``model.*``
    ``overrides`` and any further ``fields``, validated."""
    base, vocab = base_model()
    update = {"vocab_size": vocab, **{k.split(".", 1)[1]: v for k, v in overrides.items()}, **fields}
    return type(base).model_validate(base.model_copy(update=update).model_dump())


def model_overrides(variant: str) -> dict[str, Any]:
    """The variant's ``model.*`` settings over ``PAPER``, plus the ``d_ff`` that keeps its parameters within 1 % of
    the paper model's."""
    from aiayn.model import Transformer

    over = PAPER | VARIANTS[variant]
    ref = Transformer(variant_config(PAPER), device="meta").num_parameters()

    def count(d_ff: int) -> int:
        return Transformer(variant_config(over, d_ff=d_ff), device="meta").num_parameters()

    d_ff = base_model()[0].d_ff
    if abs(count(d_ff) - ref) / ref > 0.01:
        over["model.d_ff"] = min(range(8, 8 * d_ff, 8), key=lambda d: abs(count(d) - ref))
    return over


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs: dict[tuple, dict[str, Any]] = {}

    def add(variant: str, seed: int, data_seed: int, study: str) -> None:
        key = (variant, seed, data_seed)
        run = runs.setdefault(key, {"variant": variant, "seed": seed, "data_seed": data_seed, "studies": [],
                                    "name": f"{args.tag}-{variant}-s{seed}-d{data_seed}".replace("_", "-")})
        run["studies"].append(study)

    for s in args.seeds:
        add("paper", s, 1, "seed")
    for d in args.data_seeds:
        add("paper", 1, d, "data_seed")
    for v in args.variants:
        for s in args.variant_seeds:
            add(v, s, 1, "variant")
    return list(runs.values())


def extend(existing: list[dict[str, Any]], planned: list[dict[str, Any]], experiments: set[str],
           budget: dict[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Merge a new plan into a study's saved plan: ``(all runs, runs to queue)``.

    A run keeps its saved entry (its ``studies`` gain the new plan's); it is queued only when no DVC
    experiment has its name (``experiments``). Raises ``ValueError`` when the saved runs' budget differs
    from ``budget``.
    """
    for run in existing:
        if run.get("budget", budget) != budget:
            raise ValueError(f"study run {run['name']} was trained with --budget {run.get('budget')}, not {budget}: "
                             "extend a study with its own budget, or start a new --tag")
    merged = {r["name"]: {**r, "budget": budget} for r in existing}
    for run in planned:
        old = merged.setdefault(run["name"], {**run, "budget": budget})
        old["studies"] = list(dict.fromkeys([*old["studies"], *run["studies"]]))
    runs = list(merged.values())
    return runs, [r for r in runs if r["name"] not in experiments]


def set_flag(raw: dict[str, Any], key: str, value: Any) -> str:
    """``-S`` argument: ``key=value`` when params.yaml has the key, ``+key=value`` (append) otherwise."""
    text = json.dumps(value) if isinstance(value, (list, dict)) or value is None else value  # None: Hydra's null
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return f"+{key}={text}"
        node = node[part]
    return f"{key}={text}"


def threads_per_job(jobs: int) -> int:
    """Intra-op threads of each of ``jobs`` concurrent runs: the cores shared out, at least 1."""
    return max(1, (os.cpu_count() or 1) // jobs)


def stats(values: list[float]) -> dict[str, float]:
    """Sample statistics of ``values``: n, mean, standard deviation (n - 1; 0 for one value), min, max, range."""
    return {"n": len(values), "mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "range": max(values) - min(values)}


def noise_verdict(delta: float, seed_std: float | None) -> str:
    """"yes" when ``|delta|`` (BLEU) exceeds 2 x the seed standard deviation, "no" when not, "n/a" when
    either is unknown (no paper run, or no seed study in this report)."""
    if seed_std is None or delta != delta:  # NaN: no paper run to compare with
        return "n/a"
    return "yes" if abs(delta) > 2 * seed_std else "no"


def join_longer_than(lines: list[str], n_tokens: Callable[[str], int], limit: int, *, min_join: int = 2,
                     max_join: int = 4) -> list[tuple[int, int]]:
    """Length-extrapolation inputs: ``(start, k)`` spans of ``k`` consecutive lines (``min_join <= k <=
    max_join``) whose joined text is longer than ``limit`` tokens (``n_tokens(" ".join(...))``).

    Walks the lines once: from each start, the fewest lines that exceed ``limit``; the next span starts
    after them. A start that cannot exceed ``limit`` with ``max_join`` lines is skipped.
    """
    spans, i = [], 0
    while i + min_join <= len(lines):
        k = next((k for k in range(min_join, max_join + 1)
                  if i + k <= len(lines) and n_tokens(" ".join(lines[i:i + k])) > limit), None)
        if k is None:
            i += 1
        else:
            spans.append((i, k))
            i += k
    return spans
