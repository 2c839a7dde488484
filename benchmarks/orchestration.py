"""Orchestration overhead: each stage through its Prefect flow vs the stage function called directly.

One process, one scratch project on the smoke configuration (``pipelines.scratch``),
the corpus copied from the mirror once. For every stage and round the same stage
runs directly (``aiayn.stages.<name>.run``) and as its flow (``pipelines.flows``)
against Prefect's temporary local API, and, with ``--server URL``, against a running
Prefect server; the order alternates between rounds so machine noise hits all alike.
Train checkpoints are deleted before each train run (else it would resume, finished).
Tables report medians.

``--subprocess`` also times each stage the way ``dvc repro`` runs it: a fresh
``python -m pipelines.stage <name>`` process vs ``aiayn <name>`` (the CLI without
Prefect); without ``--server`` every such process starts its own temporary API.

Finally a no-op ``dvc repro`` (outputs committed, nothing changed) is timed through the
``dvc`` CLI and through the Python API the ``pipeline`` flow uses.

    python benchmarks/orchestration.py [--server http://127.0.0.1:4200/api] [--rounds 1]
        [--stages prepare,tokenize,train,evaluate] [--subprocess] [--params configs/smoke.yaml]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("prepare", "tokenize", "train", "evaluate")


def _timed(fn: Callable[[], object]) -> float:
    """Wall time of ``fn()`` in seconds."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _table(title: str, rows: list[tuple[str, float, float]], base: str = "direct s", other: str = "prefect s") -> str:
    """Markdown table: stage, base s, other s, overhead s, overhead % (+ a total row)."""
    lines = [f"### {title}", "", f"| stage | {base} | {other} | overhead s | overhead % |", "|---|---:|---:|---:|---:|"]
    total_a = total_b = 0.0
    for stage, a, b in rows:
        total_a, total_b = total_a + a, total_b + b
        lines.append(f"| {stage} | {a:.2f} | {b:.2f} | {b - a:+.2f} | {100 * (b - a) / a:+.1f} |")
    if len(rows) > 1:
        lines.append(
            f"| **total** | {total_a:.2f} | {total_b:.2f} | {total_b - total_a:+.2f} | "
            f"{100 * (total_b - total_a) / total_a:+.1f} |"
        )
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _api(url: str | None) -> Iterator[None]:
    """Point Prefect at ``url`` inside the block (None: the temporary local API)."""
    if url is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=None, help="API URL of a running Prefect server (e.g. http://127.0.0.1:4200/api)")
    ap.add_argument("--params", default=str(REPO / "configs" / "smoke.yaml"), help="params file (default: smoke)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages, in pipeline order")
    ap.add_argument("--rounds", type=int, default=1, help="repetitions per stage and mode (median reported)")
    ap.add_argument("--subprocess", action="store_true", help="also time `python -m pipelines.stage` vs `aiayn` processes")
    ap.add_argument("--mirror", default=os.environ.get("AIAYN_DATA_MIRROR", str(REPO.parent / "shared" / "data" / "multi30k")))
    args = ap.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    if unknown := [s for s in stages if s not in STAGES]:
        ap.error(f"unknown stage(s) {unknown}; choose from {STAGES}")

    work = Path(tempfile.mkdtemp(prefix="aiayn-bench-orch-"))
    os.environ.pop("PREFECT_API_URL", None)  # "temporary API" must mean that; a server is --server
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))  # before prefect is imported
    for key, value in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1",
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", "AIAYN_DATA_MIRROR": args.mirror}.items():
        os.environ.setdefault(key, value)

    import importlib

    from prefect import flow

    from aiayn.config import load_params
    from aiayn.stages import Layout
    from pipelines.flows import STAGE_FLOWS
    from pipelines.scratch import scratch_project

    try:
        root = scratch_project(work / "project", args.params)
        layout, params = Layout(root), load_params(root / "params.yaml")
        importlib.import_module("aiayn.stages.fetch").run(layout, mirror=Path(args.mirror))
        for stage in stages:  # import outside the timings (both modes share the process)
            importlib.import_module(f"aiayn.stages.{stage}")

        @flow(name="noop")
        def noop() -> None:
            """Nothing: the first call of a process pays the API start-up."""

        modes: dict[str, str | None] = {"temporary API": None}
        if args.server:
            modes[f"server {args.server}"] = args.server
        startup = {}
        for mode, url in modes.items():
            with _api(url):
                startup[mode] = _timed(noop)

        def direct(stage: str) -> None:
            importlib.import_module(f"aiayn.stages.{stage}").run(params, layout)

        def through(stage: str, url: str | None) -> None:
            with _api(url):
                state = STAGE_FLOWS[stage](params_path="params.yaml", root=str(root), return_state=True)
            if not state.is_completed():
                raise RuntimeError(f"{stage} flow: {state.message}")

        times: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for stage in stages:
                runs = [("direct", lambda s=stage: direct(s))]
                runs += [(mode, lambda s=stage, u=url: through(s, u)) for mode, url in modes.items()]
                for name, fn in runs if r % 2 == 0 else runs[::-1]:
                    if stage == "train":
                        shutil.rmtree(layout.checkpoints, ignore_errors=True)
                    times.setdefault((stage, name), []).append(_timed(fn))
                    print(f"round {r} {stage:9s} {name:40s} {times[(stage, name)][-1]:7.2f} s", file=sys.stderr)

        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
              f"Python {platform.python_version()}; params {args.params}; {args.rounds} round(s), medians.\n")
        for mode in modes:
            print(f"First flow call of the process ({mode}): {startup[mode]:.2f} s (one-off API start-up / connection)\n")
            print(_table(f"In-process: stage function vs its flow ({mode})",
                         [(s, med[(s, "direct")], med[(s, mode)]) for s in stages]))

        if args.subprocess:
            env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
            if args.server:
                env["PREFECT_API_URL"] = args.server
            rows = []
            for stage in stages:
                cli = [str(Path(sys.executable).parent / "aiayn"), stage, "--root", str(root), "--params", str(root / "params.yaml")]
                via = [sys.executable, "-m", "pipelines.stage", stage, "--root", str(root)]
                pair = []
                for cmd in (cli, via):
                    if stage == "train":
                        shutil.rmtree(layout.checkpoints, ignore_errors=True)
                    pair.append(_timed(lambda c=cmd: subprocess.run(c, env=env, cwd=root, check=True,
                                                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
                rows.append((stage, *pair))
            where = f"server {args.server}" if args.server else "a temporary API per process"
            print(_table(f"As DVC runs a stage: fresh process, `aiayn <stage>` vs `python -m pipelines.stage` ({where})",
                         rows, base="aiayn s", other="pipelines.stage s"))

        from dvc.repo import Repo

        with contextlib.chdir(root), Repo(str(root)) as repo:
            repo.commit(force=True)  # record the outputs made above in dvc.lock
        env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        cli_s = _timed(lambda: subprocess.run(["dvc", "repro"], cwd=root, env=env, check=True, stdout=subprocess.DEVNULL))

        def api_repro() -> None:
            with contextlib.chdir(root), Repo(str(root)) as repo:
                if ran := repo.reproduce():
                    raise RuntimeError(f"no-op repro ran {ran}")

        api_s = _timed(api_repro)
        print("### No-op `dvc repro` (nothing changed)\n\n| how | s |\n|---|---:|")
        print(f"| `dvc repro` (CLI process) | {cli_s:.2f} |\n| `Repo(root).reproduce()` (pipeline flow's call) | {api_s:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
