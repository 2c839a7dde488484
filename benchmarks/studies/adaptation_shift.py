"""Adapting to a real domain shift built from Multi30k: does continued training (``train.init_from``) win the new
domain back without losing the old, and what does replay buy?

The shift: every training pair whose English source mentions one of ``--words`` (default: water scenes) is a
topical *slice* the base model never sees. The slice is split (seeded) into an adaptation train part, a
validation part and a held-out test part (``new_test``). Runs, each a project of its own driven through the
``aiayn`` stage commands as a user would (corpus, prepare, tokenize, train, evaluate; tracking off):

- ``base``: the main job's recipe on Multi30k minus the slice, ``--base-steps`` updates;
- ``adapted``: ``train.init_from`` = the base's model, ``--adapt-steps`` updates on the slice's train part,
  ``finetune.replay_share`` 0 and ``--replay`` (the base's prepared training pairs), one run per ``--seeds``;
- ``scratch``: from scratch on base + slice train for ``--base-steps + --adapt-steps`` updates: what the same
  updates (about the same minutes) give without the base.

Every model is scored with sacreBLEU on ``new_test`` and on test_2016_flickr, test_2017_flickr and
test_2017_mscoco (greedy or ``--beam-size``, the first ``--eval-pairs`` pairs of each set), and the two-sided
gate decides on each adapted model against the base (``--gain-min``, ``--loss-max``). Prints a Markdown table
with the host line; ``--out`` keeps the projects and ``results.json``.

    python benchmarks/studies/adaptation_shift.py --out /tmp/adapt-study
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import REPO, host_line, markdown_table

DEFAULT_WORDS = "water,ocean,beach,lake,swim,swimming,pool,waves,surf,surfer,boat"
OLD_TESTS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
STAGES = ("corpus", "prepare", "tokenize", "train", "evaluate")


def _read(mirror: Path, split: str, lang: str) -> list[str]:
    with gzip.open(mirror / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _write_tsv(path: Path, pairs: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = [(s.replace("\t", " "), t.replace("\t", " ")) for s, t in pairs]  # a few captions hold a tab
    path.write_text("".join(f"{s}\t{t}\n" for s, t in clean), encoding="utf-8")


def build_corpora(mirror: Path, out: Path, words: list[str], seed: int = 0) -> dict[str, int]:
    """``out/base`` (train and val without the slice), ``out/slice`` (the slice's train/val parts) and
    ``out/union`` (base train + slice train); each with the three old test sets and ``new_test``."""
    topic = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)
    train = list(zip(_read(mirror, "train", "en"), _read(mirror, "train", "de"), strict=True))
    val = list(zip(_read(mirror, "val", "en"), _read(mirror, "val", "de"), strict=True))
    in_slice = [p for p in train if topic.search(p[0])]
    base_train = [p for p in train if not topic.search(p[0])]
    base_val = [p for p in val if not topic.search(p[0])]
    random.Random(seed).shuffle(in_slice)
    n_val, n_test = 200, max(200, len(in_slice) // 3)
    slice_val, new_test, slice_train = in_slice[:n_val], in_slice[n_val:n_val + n_test], in_slice[n_val + n_test:]
    # one Multi30k training pair's target is "@@" (a BPE marker): the validation scorer refuses it as a reference
    slice_val, new_test = ([p for p in part if "@@" not in p[1]] for part in (slice_val, new_test))
    tests = {t: list(zip(_read(mirror, t, "en"), _read(mirror, t, "de"), strict=True)) for t in OLD_TESTS}
    tests["new_test"] = new_test
    for name, (tr, va) in {"base": (base_train, base_val), "slice": (slice_train, slice_val),
                           "union": (base_train + slice_train, base_val)}.items():
        _write_tsv(out / name / "train.tsv", tr)
        _write_tsv(out / name / "val.tsv", va)
        for t, pairs in tests.items():
            _write_tsv(out / name / f"{t}.tsv", pairs)
    return {"slice": len(in_slice), "slice_train": len(slice_train), "slice_val": len(slice_val),
            "new_test": len(new_test), "base_train": len(base_train), "base_val": len(base_val)}


def project_params(corpus: Path, *, steps: int, seed: int, eval_pairs: int, beam_size: int,
                   init_from: Path | None = None, replay: float = 0.0, replay_path: Path | None = None,
                   adapt_warmup: int = 30, adapt_lr_scale: float = 0.5) -> dict:
    """The main job's ``params.yaml`` with the study's corpus, budget, seed and (adapted runs) parent."""
    import yaml

    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["data"].update(corpus={"kind": "tsv", "path": str(corpus)}, test_splits=[*OLD_TESTS, "new_test"],
                     max_eval_pairs=eval_pairs)
    t = p["train"]
    t.update(seed=seed, data_seed=seed, max_steps=steps, max_time_s=None, validate_every=max(steps // 2, 1),
             checkpoint_every=max(steps // 10, 1), keep_checkpoints=3, average_last=3,
             warmup_steps=min(t["warmup_steps"], max(steps // 3, 1)))
    if init_from is not None:
        t["init_from"] = str(init_from)
        t["finetune"] = {**(t.get("finetune") or {}), "warmup_steps": min(adapt_warmup, max(steps // 3, 1)), "lr_scale": adapt_lr_scale,
                         "replay_share": replay, "replay_path": str(replay_path) if replay else None}
    p["evaluate"]["beam_size"] = beam_size
    return p


def run_project(root: Path, params: dict, env: dict[str, str]) -> dict:
    """The five stages in ``root``; returns ``{"scores": {split: bleu}, "train_s", "train": train_metrics}``."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    text, done = yaml.safe_dump(params, sort_keys=False), root / "study.json"
    if done.is_file() and (root / "params.yaml").read_text() == text:  # finished before with these params
        return json.loads(done.read_text())
    (root / "params.yaml").write_text(text)
    seconds = {}
    for stage in STAGES:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "aiayn", stage, "--params", "params.yaml", "--root", str(root)],
                           env=env, capture_output=True, text=True)
        seconds[stage] = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"{root.name}: {stage} exited {r.returncode}: {r.stderr.strip()[-2000:]}")
    metrics = json.loads((root / "artifacts" / "eval_metrics.json").read_text())
    train = json.loads((root / "artifacts" / "train_metrics.json").read_text())
    result = {"scores": {s: m["bleu"] for s, m in metrics.items()}, "chrf": {s: m["chrf"] for s, m in metrics.items()},
              "train_s": seconds["train"], "seconds": seconds, "budget": train.get("budget")}
    done.write_text(json.dumps(result))
    return result


def gate(adapted: dict, base: dict, gain_min: float, loss_max: float) -> str:
    """The two-sided rule: gain on ``new_test`` >= gain_min and a loss <= loss_max on every old test set."""
    gain = adapted["scores"]["new_test"] - base["scores"]["new_test"]
    losses = {t: base["scores"][t] - adapted["scores"][t] for t in OLD_TESTS}
    worst = max(losses, key=losses.get)
    if gain < gain_min:
        return f"refused: gain {gain:+.2f} < {gain_min}"
    if losses[worst] > loss_max:
        return f"refused: {worst} -{losses[worst]:.2f} > {loss_max}"
    return f"promoted: gain {gain:+.2f}, worst loss {max(losses[worst], 0):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirror", type=Path, default=Path(os.environ.get("AIAYN_DATA_MIRROR", REPO.parent / "shared/data/multi30k")))
    ap.add_argument("--out", type=Path, required=True, help="folder for the corpora, projects and results.json")
    ap.add_argument("--words", default=DEFAULT_WORDS, help="comma-separated source words that make the slice")
    ap.add_argument("--base-steps", type=int, default=600)
    ap.add_argument("--adapt-steps", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--replay", type=float, default=0.5, help="replay share of the replay runs")
    ap.add_argument("--eval-pairs", type=int, default=500, help="first N pairs of each test set")
    ap.add_argument("--beam-size", type=int, default=1)
    ap.add_argument("--gain-min", type=float, default=1.0)
    ap.add_argument("--loss-max", type=float, default=0.5)
    args = ap.parse_args()

    host = host_line()
    print(host, flush=True)
    env = {**os.environ, "AIAYN_TRACKING": "0", "PYTHONPATH": str(REPO / "src")}
    sizes = build_corpora(args.mirror, args.out / "corpora", [w.strip() for w in args.words.split(",")])
    print(f"corpora: {sizes}", flush=True)
    common = {"eval_pairs": args.eval_pairs, "beam_size": args.beam_size}
    results: dict[str, dict] = {}
    base_root = args.out / "base"
    results["base"] = run_project(base_root, project_params(args.out / "corpora/base", steps=args.base_steps,
                                                            seed=1, **common), env)
    print(f"base: {results['base']}", flush=True)
    for replay in (0.0, args.replay):
        for seed in args.seeds:
            name = f"adapted replay {replay:g} seed {seed}"
            params = project_params(args.out / "corpora/slice", steps=args.adapt_steps, seed=seed,
                                    init_from=base_root / "artifacts" / "model", replay=replay,
                                    replay_path=base_root / "artifacts" / "prepared" / "train", **common)
            results[name] = run_project(args.out / name.replace(" ", "-"), params, env)
            print(f"{name}: {results[name]}", flush=True)
    results["scratch"] = run_project(args.out / "scratch", project_params(
        args.out / "corpora/union", steps=args.base_steps + args.adapt_steps, seed=1, **common), env)

    rows = []
    for name, r in results.items():
        s = r["scores"]
        decision = gate(r, results["base"], args.gain_min, args.loss_max) if name.startswith("adapted") else ""
        rows.append([name, f"{s['new_test']:.2f}", *(f"{s[t]:.2f}" for t in OLD_TESTS),
                     f"{r['train_s'] / 60:.1f}", decision])
    print(markdown_table(["run", "new_test BLEU", *OLD_TESTS, "train min", "gate vs base"], rows))
    print(host)
    (args.out / "results.json").write_text(json.dumps({"host": host, "sizes": sizes, "args": {
        k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2))


if __name__ == "__main__":
    main()
