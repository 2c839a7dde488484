"""What a stage run's lineage costs: bytes read and seconds of MLflow tracking per stage, two checkouts compared.

Each stage run's tracking hashes what it reads (at its start) and wrote (at its end) as DVC does, names the corpus
its config reads (``data.version``) and, for ``train``, logs the corpus and training files as dataset inputs
(``aiayn.tracking``). This builds one project with the repository's ``dvc.yaml`` and a corpus of one's own
(``corpora/mine``: not ``data.dvc``'s, so it is hashed, not looked up) of ``--mb`` MB of training text per side,
then times ``Tracker`` runs of ``prepare``, ``train`` and ``evaluate`` (with their stages' records and dataset
reads; ``corpus`` and ``tokenize`` have no MLflow run) with no work inside, for each
``--src`` checkout in turn (alternating rounds, a fresh process and MLflow store each), counting the bytes each
opens under the project. The files stay in the page cache, so seconds are MD5 (~0.8 GB/s a core on an AMD EPYC
Zen 4) plus MLflow's calls (a first run, not timed, creates the store); a cold disk adds its read time per byte.

    python benchmarks/perf/lineage_reads.py --src /tmp/old-checkout --src . [--mb 200] [--rounds 3]

Prints a Markdown table (median and spread over rounds, per stage and checkout), the host line and one core's
GB/s of MD5 and of two ways to count lines (``aiayn.provenance.file_digest`` does both in its one read). Results:
docs/results.md, "What a stage run's lineage reads".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import REPO, Spread, host_line, markdown_table, round_order

STAGES = ("prepare", "train", "evaluate")  #: the stages with an MLflow run of their own that read the corpus
FOLDERS = ("corpora/mine", "artifacts/corpus", "artifacts/prepared")
SPLITS = {"train": 1.0, "val": 0.01, "test_2016_flickr": 0.01}  # share of --mb


def build(root: Path, mb: int, repo: Path) -> None:
    """The project: the repository's pipeline files and ``--mb`` MB of random text per language and folder."""
    import random
    import shutil

    for name in ("dvc.yaml", "dvc.lock", "params.yaml", "data.dvc"):
        shutil.copy(repo / name, root / name)
    rng = random.Random(0)
    line = b"".join(bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz ", k=79)) + b"\n" for _ in range(4096))
    for folder in (*FOLDERS, "artifacts/tokenized"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for split, share in SPLITS.items():
            for lang in ("en", "de"):
                with (root / folder / f"{split}.{lang}").open("wb") as f:
                    for _ in range(max(1, round(mb * share * (1 << 20) / len(line)))):
                        f.write(line)


def worker(root: Path, store: Path) -> dict[str, dict[str, float]]:
    """Seconds and MB opened for reading under ``root`` by each stage's ``Tracker`` run (imports ``aiayn`` from
    ``PYTHONPATH``: the ``src/`` of the checkout under test, which Python searches before the editable install)."""
    import pathlib
    import time

    from aiayn.config.schema import load_params
    from aiayn.stages import Layout, split_reads
    from aiayn.stages.evaluate import RECORD as EVALUATE
    from aiayn.stages.prepare import RECORD as PREPARE
    from aiayn.stages.train import RECORD as TRAIN
    from aiayn.tracking import Tracker

    opened = [0]
    real_open = pathlib.Path.open

    def counting_open(self, mode="r", *args, **kwargs):
        if "r" in mode and "b" in mode and root in self.absolute().parents:
            opened[0] += self.stat().st_size
        return real_open(self, mode, *args, **kwargs)

    pathlib.Path.open = counting_open
    params = load_params(root / "params.yaml").model_dump(mode="json")
    params["data"]["corpus"]["path"] = "corpora/mine"
    uri = f"sqlite:///{store.as_posix()}"
    with Tracker("warmup", project_root=root, tracking_uri=uri, params=params):  # creates the MLflow store: not
        pass  # a dvc.yaml stage, so it hashes nothing
    out = {}
    records = {"prepare": PREPARE,
               "train": TRAIN.reading(*split_reads(Layout(root), ["train", "val"], ["en", "de"], "training")),
               "evaluate": EVALUATE.reading(*split_reads(Layout(root), ["test_2016_flickr"], ["en", "de"], "test"))}
    for stage in STAGES:
        record = records[stage]
        opened[0], t0 = 0, time.perf_counter()
        with Tracker(record, project_root=root, tracking_uri=uri, params=params):
            pass
        out[stage] = {"s": time.perf_counter() - t0, "mb": opened[0] / (1 << 20)}
    return out


def rates(mb: int = 256) -> str:
    """One core's GB/s of what a digest does to each byte: MD5, and a line count by ``bytes.count`` or numpy."""
    import hashlib
    import time

    import numpy as np

    block = (b"a quick brown fox jumps over the lazy dog and runs on through the dark forest\n" * 14000)[: 1 << 20]
    h = hashlib.md5()  # noqa: S324
    ways = {"MD5": lambda: h.update(block), "bytes.count": lambda: block.count(b"\n"),
            "numpy count": lambda: np.count_nonzero(np.frombuffer(block, np.uint8) == 0x0A)}
    out = []
    for name, fn in ways.items():
        t0 = time.perf_counter()
        for _ in range(mb):
            fn()
        out.append(f"{name} {mb / 1024 / (time.perf_counter() - t0):.1f}")
    return "GB/s on one core: " + ", ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", action="append", type=Path, required=True, help="a checkout (its src/ is imported)")
    ap.add_argument("--mb", type=int, default=200, help="MB of training text per language (corpus and artifacts)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    env = {k: v for k, v in os.environ.items() if k not in ("AIAYN_PARENT_RUN_ID", "MLFLOW_TRACKING_URI")}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        build(root, args.mb, REPO)
        for r in range(args.rounds):
            for src in round_order(args.src, r):
                store = Path(tmp) / f"mlflow-{r}-{src.name}.db"
                env["PYTHONPATH"] = str(src.resolve() / "src")
                done = subprocess.run([sys.executable, __file__, "--src", str(src), "--worker", str(root), str(store)],
                                      env=env, cwd=tmp, check=True, capture_output=True, text=True)
                for stage, m in json.loads(done.stdout.strip().splitlines()[-1]).items():
                    results.setdefault((str(src), stage), []).append(m)
    table = []
    for (src, stage), ms in results.items():
        s = Spread.of(m["s"] for m in ms)
        table.append([src, stage, f"{Spread.of(m['mb'] for m in ms).median:,.0f}", f"{s.median:.2f}", f"{s.width:.2f}"])
    print(markdown_table(["checkout", "stage", "MB read", "seconds (median)", "spread (max - min)"], table, "llrrr"))
    print(f"\n{args.mb} MB of training text per language per folder; {args.rounds} rounds; {host_line()}")
    print(rates())


if __name__ == "__main__":
    main()
