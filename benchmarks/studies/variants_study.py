"""Seed variance and the modern variants, measured against the paper's model: one command, DVC experiments.

    python benchmarks/studies/variants_study.py [--seeds 1,2,3] [--data-seeds 1,2,3] [--variants rope,alibi,gqa,swiglu,...]
        [--variant-seeds 1,2] [--budget train.max_steps=400 ...] [--jobs 2] [--tag NAME] [--collect-only]

1. **Queue** one DVC experiment per run, up to the ``evaluate`` stage
   (``dvc exp run --queue evaluate -n <tag>-<variant>-s<seed>-d<data_seed> -S ...``):
   - seed study: ``train.seed`` in ``--seeds`` with ``data_seed`` 1;
   - data-order study: ``train.data_seed`` in ``--data-seeds`` with ``seed`` 1;
   - each variant of ``--variants`` with ``train.seed`` in ``--variant-seeds``.
   Every run gets the same ``--budget`` overrides (steps, warmup, checkpoints) and
   ``train.num_threads = cores // --jobs`` (the runs share the cores; a ``--budget`` value wins). A variant whose parameter count
   differs from the paper model's by more than 1 % gets the ``d_ff`` that brings it closest
   (GQA and decoder-only lose attention weights; SwiGLU already keeps them equal).
2. **Run** them: ``dvc queue start -j JOBS``, wait until the queue is empty.
3. **Collect** BLEU/chrF per test set and the train stage's tokens/s from each experiment's
   stage runs in MLflow (found by the ``dvc.exp_name`` tag DVC's queue sets), its git revision
   from ``dvc exp show --json``. **Report**: BLEU mean, standard deviation (n-1) and range per source
   of variance and per variant, whether a variant's difference from the paper model exceeds
   the seed variance, a strip plot, and the decode side of each variant's seed-1 model (decode
   tokens/s with beam 4 at batch 32 and 1, KV-cache bytes per generated token from the cache
   object; length extrapolation: BLEU on inputs joined from 2-4 consecutive test sentences, each
   longer than the longest training source sentence, against the same sentences translated one by
   one and joined), and the training tokens/s of every variant like for like (fresh models, the same
   batches, alternating rounds; the runs' own tokens/s depend on what else shared the machine).
   These side measurements are cached per model revision in ``side.json`` (``--remeasure`` redoes them).
   Everything goes to ``test-output/variants/<tag>/`` and one MLflow run (experiment
   ``aiayn-studies``, ``aiayn.tracking.log_study``).

``--collect-only`` skips 1-2 (report on experiments already run under ``--tag``). Rerunning with a
``--tag`` that exists **extends** that study: only runs with no DVC experiment of their name yet are
queued, and the report covers old and new runs together; the ``--budget`` must be the study's
(refused otherwise: runs at different budgets are not comparable).

The plan and the report's statistics: ``tests/support/variants_plan.py``. Results:
docs/studies/seed-variance-and-variants.md and docs/studies/pre-norm.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from aiayn.io import atomic_write_json
from benchmarks.harness import REPO as ROOT
from benchmarks.harness import Spread, alternate, host_line, markdown_row, markdown_table, ratios
from benchmarks.tests_support.variants_plan import (VARIANTS, base_model, extend, join_longer_than, model_overrides,
                                                    noise_verdict, plan, set_flag, stats, threads_per_job,
                                                    variant_config)
BIN = Path(sys.executable).parent
DVC = str(BIN / "dvc")

SPLITS_KEY = "artifacts/eval_metrics.json"
PRIMARY = "test_2016_flickr"


def sh(*cmd: str, check: bool = True, timeout: float = 600) -> str:
    # The queue's workers start `dvc`, and the stages `python`, from PATH: this venv's first (as the Makefile does).
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


# ----------------------------------------------------------------------------------------- planning


def queue(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    cache: dict[str, dict[str, Any]] = {}
    for run in runs:
        over = cache.setdefault(run["variant"], model_overrides(run["variant"]))
        run["overrides"] = over
        sets = {"train.num_threads": threads_per_job(args.jobs), **args.budget, "train.seed": run["seed"],
                "train.data_seed": run["data_seed"], **over}
        flags = [x for k, v in sets.items() for x in ("-S", set_flag(raw, k, v))]
        sh(DVC, "exp", "run", "--queue", "evaluate", "-n", run["name"], *flags)
        print(f"queued {run['name']}: {sets}", file=sys.stderr, flush=True)


def run_queue(jobs: int, poll_s: float = 20.0) -> None:
    # The workers are daemons that inherit the starter's stdout/stderr: a captured pipe would stay
    # open until the queue is empty, so the starter writes to a log file instead.
    log_path = ROOT / ".dvc" / "tmp" / "variants-queue-start.log"
    with log_path.open("ab") as logf:
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        started = subprocess.run([DVC, "queue", "start", "-j", str(jobs)], cwd=ROOT, stdout=logf, stderr=logf,
                                 stdin=subprocess.DEVNULL, env=env, timeout=600)
    if started.returncode:
        raise RuntimeError(f"dvc queue start failed ({started.returncode}); see {log_path}")
    while True:
        status = sh(DVC, "queue", "status", check=False)
        busy = [line for line in status.splitlines() if re.search(r"\b(Queued|Running)\b", line)]
        if not busy:
            break
        print(f"{datetime.now():%H:%M:%S} {len(busy)} queued/running", file=sys.stderr, flush=True)
        time.sleep(poll_s)
    sh(DVC, "queue", "stop", check=False)


# ----------------------------------------------------------------------------------------- collecting


def _walk(node: Any):
    if isinstance(node, dict):
        if node.get("name") and isinstance(node.get("data"), dict):
            yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def collect(runs: list[dict[str, Any]]) -> None:
    """Each run's git revision (``dvc exp show``), its BLEU/chrF per test set and the train stage's
    tokens/s (the stage runs in MLflow, tagged ``dvc.exp_name``: ``eval_metrics.json`` is a git-ignored,
    uncached DVC metrics file, so the experiment's commit does not hold it)."""
    entries = {e["name"]: e for e in _walk(json.loads(sh(DVC, "exp", "show", "--json", "--all-commits")))}
    from aiayn.tracking import stage_metrics_by_experiment

    names = [r["name"] for r in runs]
    train = stage_metrics_by_experiment(ROOT, names, "train")
    evaluate = stage_metrics_by_experiment(ROOT, names, "evaluate")
    for run in runs:
        e = entries.get(run["name"]) or {}
        run["rev"] = e.get("rev") or e.get("data", {}).get("rev")
        m = evaluate.get(run["name"], {})
        splits = sorted({k.rsplit(".", 1)[0] for k in m if k.endswith(".bleu")})
        run["eval"] = {sp: {"bleu": m[f"{sp}.bleu"], "chrf": m.get(f"{sp}.chrf")} for sp in splits} or None
        run["train_tokens_per_s"] = train.get(run["name"], {}).get("train_tokens_per_s")
        run["train_seconds"] = train.get(run["name"], {}).get("train_seconds")
        run["valid_loss"] = train.get(run["name"], {}).get("averaged_valid_loss")


# ----------------------------------------------------------------------------------------- decode side


def materialize_model(rev: str, dst: Path) -> Path:
    """Copy the experiment's ``artifacts/model`` out of the DVC cache (its hash from the experiment's ``dvc.lock``)."""
    lock = yaml.safe_load(sh("git", "show", f"{rev}:dvc.lock"))
    out = next(o for o in lock["stages"]["train"]["outs"] if o["path"] == "artifacts/model")
    cache = ROOT / ".dvc" / "cache" / "files" / "md5"

    def blob(md5: str) -> Path:
        return cache / md5[:2] / md5[2:]

    dst.mkdir(parents=True, exist_ok=True)
    for entry in json.loads(blob(out["md5"]).read_text()):
        target = dst / entry["relpath"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(blob(entry["md5"]), target)
    return dst


def decode_side(model_dir: Path, rounds: int = 3) -> dict[str, float]:
    """Decode tokens/s (beam 4; batches of 32 and of 1 sentence), KV-cache bytes per token per layer, and
    length extrapolation, 1 thread: BLEU on inputs joined from 2-4 consecutive test sentences, every one
    longer (source tokens, EOS included) than the longest training source sentence, vs. BLEU of the
    same sentences translated one by one and joined (same references, so the difference is the length's)."""
    import torch

    from aiayn.model.kv_cache import cache_bytes_per_token
    from aiayn.evaluation.scoring import score
    from aiayn.inference.runtimes import DecodeOptions
    from aiayn.inference.translator import Translator

    torch.set_num_threads(1)
    tr = Translator.from_dir(model_dir, device="cpu")
    prepared = ROOT / "artifacts" / "prepared"
    src = (prepared / f"{PRIMARY}.en").read_text(encoding="utf-8").splitlines()
    ref = (prepared / f"{PRIMARY}.de").read_text(encoding="utf-8").splitlines()
    opts = DecodeOptions(beam_size=4, len_penalty=0.6, max_len_a=1.0, max_len_b=50, max_tokens=10**6)
    out: dict[str, float] = {"kv_bytes_per_token_fp32": float(cache_bytes_per_token(tr.decoder.model.cfg, torch.float32))}
    for label, lines, batch in (("b32", src[:256], 32), ("b1", src[:24], 1)):
        ids = tr.encode(lines, opts)
        speeds = []
        for _ in range(rounds):
            t = time.perf_counter()
            n = 0
            for i in range(0, len(ids), batch):
                n += sum(len(h) + 1 for h in tr.decoder.translate_ids(ids[i:i + batch], opts))  # + EOS
            speeds.append(n / (time.perf_counter() - t))
        out[f"decode_tokens_per_s_{label}"] = statistics.median(speeds)
    train_src = (prepared / "train.en").read_text(encoding="utf-8").splitlines()
    limit = max(len(x) for x in tr.encode(train_src, opts))
    spans = join_longer_than(src, lambda text: len(tr.encode([text], opts)[0]), limit)
    joined_src = [" ".join(src[i:i + k]) for i, k in spans]
    joined_ref = [" ".join(ref[i:i + k]) for i, k in spans]
    lengths = [len(x) for x in tr.encode(joined_src, opts)]
    pieces = tr.translate([line for i, k in spans for line in src[i:i + k]], opts)
    separate, at = [], 0
    for _, k in spans:
        separate.append(" ".join(pieces[at:at + k]))
        at += k
    out |= {"long_inputs": float(len(spans)), "long_train_max_src_tokens": float(limit),
            "long_src_tokens_min": float(min(lengths)), "long_src_tokens_mean": statistics.mean(lengths),
            "long_bleu": score(tr.translate(joined_src, opts, long="error"), joined_ref)["bleu"],
            "long_bleu_separate": score(separate, joined_ref)["bleu"]}
    return out


def train_side(variants: list[str], steps: int = 10, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Training tokens/s of each variant's model, like for like: fresh models (the study's overrides,
    seed 0, SDPA), the same ``steps`` Multi30k training batches (``train.max_tokens``, data_seed 1),
    1 thread, ``rounds`` alternating rounds (the order rotates each round); per variant the median
    target tokens/s, its min-max, and the median of per-round ratios to the paper model."""
    import torch

    from aiayn.data.batching import collate, make_batches
    from aiayn.config.schema import load_params
    from aiayn.model import Transformer
    from aiayn.tokenizer import load_encoded
    from benchmarks.train_steps import run_steps

    torch.set_num_threads(1)
    params = load_params(ROOT / "params.yaml")
    split = load_encoded(ROOT / "artifacts" / "tokenized", params.data.train_split, vocab_size=base_model()[1])
    order = make_batches(split.src_lengths, split.tgt_lengths, params.train.max_tokens, data_seed=1, epoch=1)
    batches = [collate(split, idx) for idx in order[:steps]]
    warm = [collate(split, idx) for idx in order[steps:steps + 2]]
    names = ["paper", *[v for v in variants if v != "paper"]]
    models: dict[str, Any] = {}
    opts: dict[str, Any] = {}
    for v in names:
        torch.manual_seed(0)
        models[v] = Transformer(variant_config(model_overrides(v), attention_backend="sdpa"))
        opts[v] = torch.optim.Adam(models[v].parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        run_steps(models[v], warm, opts[v])

    def rate(v: str) -> float:
        seconds, tokens = run_steps(models[v], batches, opts[v])
        return tokens / seconds

    rates = alternate({v: (lambda v=v: rate(v)) for v in names}, rounds, rotate=True)
    out = {}
    for v in names:
        tps, vs_paper = Spread.of(rates[v]), Spread.of(ratios(rates[v], rates["paper"]))
        out[v] = {"train_tokens_per_s": tps.median, "train_tokens_per_s_min": tps.low,
                  "train_tokens_per_s_max": tps.high, "train_ratio_vs_paper": vs_paper.median,
                  "train_ratio_min": vs_paper.low, "train_ratio_max": vs_paper.high}
    return out


# ----------------------------------------------------------------------------------------- report


def _variant_rows(runs: list[dict[str, Any]], done: list[dict[str, Any]], bleu: dict[str, float], noise: float,
                  study_std: dict[str, float], metrics: dict[str, float]) -> tuple[list[str], list[str]]:
    """The variants table (``metrics`` gains each variant's numbers); ``(its lines, the study's variants)``."""
    from aiayn.model import Transformer

    lines: list[str] = []
    in_variant_study = [r for r in runs if "variant" in r["studies"]]
    variant_seeds = sorted({r["seed"] for r in in_variant_study})
    study_variants = list(dict.fromkeys(r["variant"] for r in in_variant_study if r["variant"] != "paper"))
    paper_vals = [bleu[r["name"]] for r in done if r["variant"] == "paper" and r["data_seed"] == 1
                  and r["seed"] in variant_seeds]
    paper_mean = statistics.mean(paper_vals) if paper_vals else float("nan")
    lines += markdown_table(["variant", "overrides", "params", "BLEU mean ± std (seeds)", "Δ vs paper",
                             "beyond seed noise?", "train tok/s in the run", "train tok/s like for like (x paper)",
                             "decode tok/s b32 / b1", "KV bytes/token (fp32, all layers)",
                             "long inputs: BLEU joined / separately"], []).splitlines()
    for variant in ["paper", *study_variants]:
        rs = [r for r in done if r["variant"] == variant and r["data_seed"] == 1 and r["seed"] in variant_seeds]
        if not rs:
            continue
        over = rs[0].get("overrides") or model_overrides(variant)
        cfg = variant_config(over)
        params = Transformer(cfg, device="meta").num_parameters()
        vals = [bleu[r["name"]] for r in rs]
        st = stats(vals)
        delta = st["mean"] - paper_mean
        tps = [r["train_tokens_per_s"] for r in rs if r.get("train_tokens_per_s")]
        dec = rs[0].get("decode") or {}
        verdict = "—" if variant == "paper" else noise_verdict(delta, noise if study_std else None)
        metrics |= {f"{variant}.bleu_mean": st["mean"], f"{variant}.bleu_std": st["std"], f"{variant}.params": params,
                    **{f"{variant}.{k}": v for k, v in dec.items()}}
        over_txt = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in over.items()) or "—"
        seeds_txt = ",".join(str(r["seed"]) for r in rs)
        kv_all = dec.get("kv_bytes_per_token_fp32", float("nan")) * cfg.n_layers * (2 if cfg.arch == "decoder_only" else 1)
        tps_txt = f"{statistics.median(tps):.0f}" if tps else "n/a"
        ts = rs[0].get("train_side") or {}
        metrics |= {f"{variant}.{k}": v for k, v in ts.items()}
        ts_txt = (f"{ts['train_tokens_per_s']:.0f} ({ts['train_ratio_vs_paper']:.2f}, "
                  f"{ts['train_ratio_min']:.2f}-{ts['train_ratio_max']:.2f})" if ts else "n/a")
        lines.append(markdown_row([
            variant, over_txt, f"{params / 1e6:.2f}M", f"{st['mean']:.2f} ± {st['std']:.2f} ({seeds_txt})",
            f"{delta:+.2f}", verdict, tps_txt, ts_txt,
            f"{dec.get('decode_tokens_per_s_b32', float('nan')):.0f} / {dec.get('decode_tokens_per_s_b1', float('nan')):.0f}",
            f"{kv_all:.0f}", f"{dec.get('long_bleu', float('nan')):.2f} / {dec.get('long_bleu_separate', float('nan')):.2f}"]))
    return lines, study_variants


def _long_inputs_note(done: list[dict[str, Any]]) -> list[str]:
    """The lines that describe the long inputs (none when no run measured them)."""
    lines: list[str] = []
    longest = next((r["decode"] for r in done if r.get("decode", {}).get("long_inputs")), None)
    if longest:
        lines += ["", f"Long inputs: {longest['long_inputs']:.0f} inputs of 2-4 consecutive {PRIMARY} sentences, "
                      f"{longest['long_src_tokens_min']:.0f}-{longest['long_src_tokens_mean']:.1f} (min-mean) source "
                      f"tokens, every one longer than the longest training source sentence "
                      f"({longest['long_train_max_src_tokens']:.0f} tokens, EOS included); 'separately' = the "
                      f"same sentences translated one by one and joined, against the same references."]
    return lines


def _plot(done: list[dict[str, Any]], bleu: dict[str, float], study_variants: list[str], args: argparse.Namespace,
          out_dir: Path) -> None:
    """The strip plot of BLEU per study and variant, ``out_dir/bleu.png`` (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        groups = [("seed", [bleu[r["name"]] for r in done if "seed" in r["studies"]]),
                  ("data_seed", [bleu[r["name"]] for r in done if "data_seed" in r["studies"]])]
        groups += [(v, [bleu[r["name"]] for r in done if r["variant"] == v and "variant" in r["studies"]])
                   for v in study_variants]
        groups = [(g, v) for g, v in groups if v]
        fig, ax = plt.subplots(figsize=(1.2 * len(groups) + 2, 4))
        for i, (g, vals) in enumerate(groups):
            ax.scatter([i] * len(vals), vals, s=30)
            ax.hlines(statistics.mean(vals), i - 0.25, i + 0.25)
        ax.set_xticks(range(len(groups)), [g for g, _ in groups], rotation=30)
        ax.set_ylabel(f"BLEU ({PRIMARY})")
        ax.set_title(f"Seed variance and variants ({args.tag})")
        fig.tight_layout()
        fig.savefig(out_dir / "bleu.png", dpi=120)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)


def report(runs: list[dict[str, Any]], args: argparse.Namespace, out_dir: Path) -> dict[str, float]:
    done = [r for r in runs if r.get("eval")]
    bleu = {r["name"]: r["eval"][PRIMARY]["bleu"] for r in done}
    lines = [f"### Seed variance and variants ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{platform.machine()}, {os.cpu_count()} CPUs, tag `{args.tag}`)", "", host_line(), "",
             f"`python benchmarks/studies/variants_study.py {' '.join(args.argv)}`", "",
             f"Budget (every run): {', '.join(f'{k}={v}' for k, v in args.budget.items())}; train.num_threads="
             f"{args.budget.get('train.num_threads', threads_per_job(args.jobs))}, "
             f"{args.jobs} runs at a time. BLEU = sacreBLEU on {PRIMARY} (beam 4, the evaluate stage). "
             f"{len(done)} of {len(runs)} runs finished.", ""]
    metrics: dict[str, float] = {}
    lines += markdown_table(["source of variance", "runs", "BLEU mean", "std", "min", "max", "range"], []).splitlines()
    study_std: dict[str, float] = {}
    for study, label in (("seed", "train.seed (data_seed 1)"), ("data_seed", "train.data_seed (seed 1)")):
        vals = [bleu[r["name"]] for r in done if study in r["studies"]]
        if len(vals) >= 2:
            st = stats(vals)
            study_std[study] = st["std"]
            metrics |= {f"{study}.bleu_{k}": v for k, v in st.items()}
            lines.append(markdown_row([label, st["n"], *(f"{st[k]:.2f}" for k in ("mean", "std", "min", "max", "range"))]))
    noise = max(study_std.values()) if study_std else 0.0
    lines += ["", f"A variant's difference from the paper model counts as real when it exceeds 2 x the larger "
                  f"seed standard deviation above ({2 * noise:.2f} BLEU) — and with 2 seeds per variant even that "
                  f"is a coarse test.", ""]
    variant_lines, study_variants = _variant_rows(runs, done, bleu, noise, study_std, metrics)
    lines += variant_lines
    lines += _long_inputs_note(done)
    table = "\n".join(lines)
    (out_dir / "report.md").write_text(table + "\n", encoding="utf-8")
    (out_dir / "runs.json").write_text(json.dumps(runs, indent=1, default=str), encoding="utf-8")
    _plot(done, bleu, study_variants, args, out_dir)
    return metrics


def _parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--seeds", type=ints, default=[1, 2, 3],
                    help="seed study: train.seed values with data_seed 1 (comma list; '' for none; default 1,2,3)")
    ap.add_argument("--data-seeds", type=ints, default=[1, 2, 3],
                    help="data-order study: train.data_seed values with seed 1 ('' for none; default 1,2,3)")
    ap.add_argument("--variants", type=lambda s: [x for x in s.split(",") if x],
                    default=["rope", "alibi", "gqa", "swiglu", "rmsnorm", "decoder_only"],
                    help=f"variants to train (comma list of: {', '.join(VARIANTS)}; "
                         "default rope,alibi,gqa,swiglu,rmsnorm,decoder_only)")
    ap.add_argument("--variant-seeds", type=ints, default=[1, 2], help="train.seed values per variant (default 1,2)")
    ap.add_argument("--budget", action="append", default=[], metavar="KEY=VALUE",
                    help="a params override for every run (repeatable), e.g. train.max_steps=400; "
                         "none: the main job's budget (about 26 min per run on 2 cores)")
    ap.add_argument("--jobs", type=int, default=2,
                    help="experiments at a time (dvc queue start -j); each gets cores/jobs threads (default 2)")
    ap.add_argument("--tag", default=f"var{datetime.now():%m%d%H%M}",
                    help="study name (experiment names, test-output/variants/TAG); an existing tag is extended: "
                         "only runs without an experiment are queued, with the same --budget")
    ap.add_argument("--collect-only", action="store_true", help="no training: report on the tag's finished runs")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode-side measurements")
    ap.add_argument("--no-train-side", action="store_true",
                    help="skip the like-for-like training tokens/s (fresh models, alternating rounds)")
    ap.add_argument("--remeasure", action="store_true",
                    help="redo the decode/train side measurements cached in test-output/variants/TAG/side.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    args.budget = dict(kv.split("=", 1) for kv in args.budget)
    out_dir = ROOT / "test-output" / "variants" / args.tag
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = plan(args)
    plan_file = out_dir / "plan.json"
    if args.collect_only:
        runs = json.loads(plan_file.read_text())
    else:
        existing = json.loads(plan_file.read_text()) if plan_file.is_file() else []
        experiments = set(sh(DVC, "exp", "list", "--all-commits", "--name-only").split())
        try:
            runs, todo = extend(existing, runs, experiments, args.budget)
        except ValueError as e:
            ap.error(str(e))
        print(f"study {args.tag}: {len(runs)} runs, {len(todo)} to queue", file=sys.stderr, flush=True)
        queue(todo, args)
        plan_file.write_text(json.dumps(runs, indent=1), encoding="utf-8")
        t = time.perf_counter()
        run_queue(args.jobs)
        print(f"queue finished in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    collect(runs)
    side_file = out_dir / "side.json"  # the decode / train side measurements, per variant and model revision
    side = json.loads(side_file.read_text()) if side_file.is_file() and not args.remeasure else {}
    firsts = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        first = next((r for r in sorted(runs, key=lambda r: (r["seed"], r["data_seed"]))
                      if r["variant"] == variant and r.get("rev") and r.get("eval")), None)
        if first is not None:
            firsts[variant] = first
    if not args.no_decode:
        for variant, first in firsts.items():
            cached = side.get("decode", {}).get(variant)
            if cached is None or cached.get("rev") != first["rev"]:
                with tempfile.TemporaryDirectory() as tmp:
                    cached = {"rev": first["rev"],
                              **decode_side(materialize_model(first["rev"], Path(tmp) / "model"))}
                side.setdefault("decode", {})[variant] = cached
                atomic_write_json(side_file, side)
            first["decode"] = {k: v for k, v in cached.items() if k != "rev"}
            print(f"decode side {variant}: {first['decode']}", file=sys.stderr, flush=True)
    if not args.no_train_side:
        if not set(firsts) <= set(side.get("train", {})):
            side["train"] = train_side(list(firsts))
            atomic_write_json(side_file, side)
        for variant, first in firsts.items():
            first["train_side"] = side["train"][variant]
    metrics = report(runs, args, out_dir)
    from aiayn.tracking import log_study

    run_id = log_study(ROOT, f"variants-{args.tag}", metrics, {"tag": args.tag, "jobs": args.jobs, **args.budget,
                                                              "seeds": args.seeds, "data_seeds": args.data_seeds,
                                                              "variants": sorted({r["variant"] for r in runs}),
                                                              "variant_seeds": args.variant_seeds}, out_dir)
    print((out_dir / "report.md").read_text())
    print(f"files: {out_dir}; MLflow run: {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
