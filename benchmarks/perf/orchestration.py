"""Orchestration overhead: each stage through its Prefect flow vs the stage function called directly.

One process, one scratch project on the smoke configuration (``tests/support/scratch.py``, imported as
``benchmarks.tests_support.scratch``),
the corpus copied from the mirror once. Four measurements, all in the same run:

1. **Stages in-process**: for every stage and round, the stage function
   (``aiayn.stages.<name>.run``) and its flow (``pipelines.flows``), against Prefect's
   temporary local API and, with ``--server URL``, a running Prefect server. The order
   alternates between rounds so machine noise hits all alike; train checkpoints are
   deleted before each train run (else it would resume, already finished). Medians.
2. **Wrapper only**: the same flow/task wrapper around a stage that does nothing
   (``--wrapper-reps`` repetitions): the fixed per-stage cost, free of stage noise.
3. **As DVC runs a stage** (``--subprocess``): a fresh ``python -m pipelines.run_stage
   <name>`` process vs ``aiayn <name>`` (the CLI, no Prefect), for ``--subprocess-stages``;
   without a server every such process starts its own temporary API.
4. **No-op ``dvc repro``** (outputs committed, nothing changed): through the ``dvc`` CLI
   and through the Python API the ``pipeline`` flow uses.
5. **Training inside the main job** (``--train-in-pipeline STEPS``, alone): on a second scratch
   project with the main job's params (``--train-params``, default ``params.yaml``; ``max_steps``
   = STEPS, evaluation cut to a few sentences), alternating rounds of ``aiayn train`` alone and
   ``python -m pipelines.pipeline`` (the ``make run`` process tree: pipeline flow, ``dvc repro``,
   the stage's flow process and Prefect's temporary API) with the model and checkpoints deleted
   before each. Both train the same steps on the same batches; the table compares the training
   loop's own tokens/s (``train_tokens_per_s`` in MLflow) and the train stage's wall time.

    python benchmarks/perf/orchestration.py [--server http://127.0.0.1:4200/api] [--rounds 3]
        [--stages prepare,tokenize,train,evaluate] [--subprocess] [--params configs/smoke.yaml]
    python benchmarks/perf/orchestration.py --train-in-pipeline 200 --rounds 3

Results: docs/results.md, "Orchestration and lineage overhead".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.harness import REPO, Spread, host_line, markdown_table, ratios, round_order
from pipelines.dag import STAGES, stage_module  # the pipeline's stages, in DAG order

VENV_BIN = Path(sys.executable).parent


def _timed(fn: Callable[[], object]) -> float:
    """Wall time of ``fn()`` in seconds."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _table(title: str, rows: list[tuple[str, float, float]], base: str = "direct s", other: str = "prefect s") -> str:
    """Markdown table: stage, base s, other s, overhead s, overhead % (+ a total row)."""
    if len(rows) > 1:
        rows = [*rows, ("**total**", sum(r[1] for r in rows), sum(r[2] for r in rows))]
    cells = [[stage, f"{a:.2f}", f"{b:.2f}", f"{b - a:+.2f}", f"{100 * (b - a) / a:+.1f}"] for stage, a, b in rows]
    return f"### {title}\n\n" + markdown_table(["stage", base, other, "overhead s", "overhead %"], cells, "lrrrr") + "\n"


@contextlib.contextmanager
def _api(url: str | None) -> Iterator[None]:
    """Point Prefect at ``url`` inside the block (None: the temporary local API)."""
    if url is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def _setup_env(mirror: str, work: Path) -> None:
    """Quiet, isolated tools; must run before Prefect is imported."""
    os.environ.pop("PREFECT_API_URL", None)  # "temporary API" must mean that; a server is --server
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))
    for key, value in {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1",
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", "AIAYN_DATA_MIRROR": mirror}.items():
        os.environ.setdefault(key, value)
    os.environ["PATH"] = os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")])  # `dvc`, `aiayn`, `python`


def bench_in_process(root: Path, stages: list[str], modes: dict[str, str | None], rounds: int) -> dict:
    """``{(stage, "direct" | mode): [seconds per round]}`` for stage functions and their flows."""
    from aiayn.config.schema import load_params
    from aiayn.stages import Layout
    from aiayn.tracking import MlflowRecorder
    from pipelines.flows import STAGE_FLOWS

    layout, params = Layout(root), load_params(root / "params.yaml")

    def direct(stage: str) -> None:  # with the recorder the stage's flow hands it
        importlib.import_module(stage_module(stage)).run(params, layout, recorder=MlflowRecorder(root))

    def through(stage: str, url: str | None) -> None:
        with _api(url):
            state = STAGE_FLOWS[stage](params_path="params.yaml", root=str(root), return_state=True)
        if not state.is_completed():
            raise RuntimeError(f"{stage} flow: {state.message}")

    times: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for stage in stages:
            runs = [("direct", lambda s=stage: direct(s))]
            runs += [(mode, lambda s=stage, u=url: through(s, u)) for mode, url in modes.items()]
            for name, fn in round_order(runs, r):
                if stage == "train":
                    shutil.rmtree(layout.checkpoints, ignore_errors=True)
                times.setdefault((stage, name), []).append(_timed(fn))
                print(f"round {r} {stage:9s} {name:40s} {times[(stage, name)][-1]:7.2f} s", file=sys.stderr)
    return times


def bench_wrapper(root: Path, modes: dict[str, str | None], reps: int) -> dict[str, tuple[float, float]]:
    """``{mode: (direct s, flow s)}``, medians of ``reps``: a do-nothing stage, bare vs in the stage flow wrapper."""
    from prefect import flow

    from aiayn.config.schema import load_params
    from aiayn.stages import Layout
    from pipelines.flows import run_stage

    sys.modules["aiayn.stages.noop"] = stub = types.ModuleType("aiayn.stages.noop")
    stub.run = lambda params, layout, recorder=None: {}

    @flow(name="noop-stage", log_prints=True)
    def noop_stage(params_path: str = "params.yaml", root: str = ".") -> dict:
        """The shape of every stage flow (pipelines.flows), around a stage that does nothing."""
        return run_stage("noop", load_params(Path(root) / params_path), Layout(Path(root)))

    def bare() -> None:
        stub.run(load_params(root / "params.yaml"), Layout(root))

    out = {}
    for mode, url in modes.items():
        with _api(url):
            wrapped = [_timed(lambda: noop_stage(root=str(root))) for _ in range(reps)]
        out[mode] = (statistics.median(_timed(bare) for _ in range(reps)), statistics.median(wrapped))
    return out


def bench_subprocess(root: Path, stages: list[str], url: str | None) -> list[tuple[str, float, float]]:
    """``[(stage, aiayn s, pipelines.run_stage s)]``: one fresh process each, as a DVC stage cmd runs."""
    env = dict(os.environ)
    if url:
        env["PREFECT_API_URL"] = url
    rows = []
    for stage in stages:
        cli = [str(VENV_BIN / "aiayn"), stage, "--root", str(root), "--params", str(root / "params.yaml")]
        via = [sys.executable, "-m", "pipelines.run_stage", stage, "--root", str(root)]
        pair = []
        for cmd in (cli, via):
            if stage == "train":
                shutil.rmtree(root / "artifacts" / "checkpoints", ignore_errors=True)
            pair.append(_timed(lambda c=cmd: subprocess.run(c, env=env, cwd=root, check=True,
                                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        print(f"subprocess {stage:9s} {url or 'temporary API':40s} {pair[0]:7.2f} {pair[1]:7.2f} s", file=sys.stderr)
        rows.append((stage, *pair))
    return rows


def bench_noop_repro(root: Path) -> tuple[float, float]:
    """``(CLI s, API s)`` of a ``dvc repro`` that has nothing to do (outputs committed first)."""
    from dvc.repo import Repo

    with contextlib.chdir(root), Repo(str(root)) as repo:
        repo.commit(force=True)  # record the outputs made above in dvc.lock
    cli_s = _timed(lambda: subprocess.run(["dvc", "repro", "--quiet"], cwd=root, check=True))

    def api_repro() -> None:
        with contextlib.chdir(root), Repo(str(root)) as repo:
            if ran := repo.reproduce():
                raise RuntimeError(f"no-op repro ran {ran}")

    return cli_s, _timed(api_repro)


def _train_tokens_per_s(root: Path) -> tuple[float, float]:
    """(tokens/s, train seconds) of the newest ``train`` run in ``root``'s MLflow store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    run = client.search_runs(exps, "tags.`aiayn.stage` = 'train'", order_by=["attributes.start_time DESC"], max_results=1)[0]
    return run.data.metrics["train_tokens_per_s"], run.data.metrics["train_seconds"]


def _train_run_count(root: Path) -> int:
    """Number of ``train`` stage runs in ``root``'s MLflow store (0 before the first)."""
    from mlflow.tracking import MlflowClient

    if not (root / "mlflow.db").exists():
        return 0
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(exps, "tags.`aiayn.stage` = 'train'", max_results=1000))


def bench_train_in_pipeline(work: Path, params_path: str, steps: int, rounds: int, mirror: str) -> str:
    """Markdown table: the train stage alone (``aiayn train``) vs inside ``python -m pipelines.pipeline``."""
    import yaml

    from benchmarks.tests_support.scratch import scratch_project

    raw = yaml.safe_load(Path(params_path).read_text(encoding="utf-8"))
    raw.setdefault("train", {})["max_steps"] = steps
    raw.setdefault("data", {})["max_eval_pairs"] = 16  # evaluation is not what is measured
    raw["quantize"] = {"variants": ["ct2-float32"], "layer_attribution": False, "throughput": False,
                       "score_check_sentences": 8, "calibration_sentences": 16}
    (work / "train-params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    with contextlib.redirect_stdout(sys.stderr):
        root = scratch_project(work / "main-job", work / "train-params.yaml")
    env = dict(os.environ)
    run = lambda cmd: subprocess.run(cmd, env=env, cwd=root, check=True,  # noqa: E731
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pipeline = [sys.executable, "-m", "pipelines.pipeline", "--root", str(root), "--no-push", "--mirror", mirror]
    run(pipeline)  # fetch, prepare, tokenize once (and a first train, not counted)
    rows: dict[str, list[tuple[float, float, float]]] = {"alone": [], "pipeline": []}
    for r in range(rounds):
        pair = [("alone", [str(VENV_BIN / "aiayn"), "train", "--root", str(root)]), ("pipeline", pipeline)]
        for k, (name, cmd) in enumerate(round_order(pair, r)):
            for out in ("model", "checkpoints"):
                shutil.rmtree(root / "artifacts" / out, ignore_errors=True)
            # a new `train.max_time_s` (far above what 'steps' take: never reached) makes DVC's train stage
            # stale, so the pipeline really trains instead of restoring the model from the DVC cache
            raw["train"]["max_time_s"] = 100_000 + 2 * r + k
            (root / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
            before = _train_run_count(root)
            wall = _timed(lambda c=cmd: run(c))
            if _train_run_count(root) != before + 1:
                raise RuntimeError(f"round {r} {name}: no new train run was recorded (did DVC skip the stage?)")
            tps, secs = _train_tokens_per_s(root)
            rows[name].append((tps, secs, wall))
            print(f"round {r} train {name:9s} {tps:8.0f} tok/s  loop {secs:7.1f} s  process {wall:7.1f} s", file=sys.stderr)
    tps = {k: [v[0] for v in rows[k]] for k in rows}
    per_round = ratios(tps["pipeline"], tps["alone"])
    spread = Spread.of(per_round)
    table = markdown_table(["round", "alone tok/s", "in pipeline tok/s", "in pipeline / alone"],
                           [[i + 1, f"{a:.0f}", f"{p:.0f}", f"{q:.3f}"]
                            for i, (a, p, q) in enumerate(zip(tps["alone"], tps["pipeline"], per_round))], "rrrr")
    return (f"### Training inside the main job: `aiayn train` alone vs inside `python -m pipelines.pipeline` "
            f"({steps} steps of `{Path(params_path).name}`, {rounds} alternating rounds)\n\n{table}\n\n"
            f"Median {Spread.of(tps['pipeline']).median:.0f} / {Spread.of(tps['alone']).median:.0f} tok/s; ratio median "
            f"{spread.median:.3f} (min {spread.low:.3f}, max {spread.high:.3f}).\n")


def _parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=None, help="API URL of a running Prefect server (e.g. http://127.0.0.1:4200/api)")
    ap.add_argument("--params", default=str(REPO / "configs" / "smoke.yaml"), help="params file (default: smoke)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages, in pipeline order")
    ap.add_argument("--rounds", type=int, default=1, help="repetitions per stage and mode (median reported)")
    ap.add_argument("--wrapper-reps", type=int, default=5, help="repetitions of the do-nothing stage")
    ap.add_argument("--subprocess", action="store_true", help="also time `python -m pipelines.run_stage` vs `aiayn` processes")
    ap.add_argument("--subprocess-stages", default="prepare,tokenize,evaluate",
                    help="stages for --subprocess (the per-process cost does not depend on the stage)")
    ap.add_argument("--mirror", default=os.environ.get("AIAYN_DATA_MIRROR", str(REPO.parent / "shared" / "data" / "multi30k")))
    ap.add_argument("--train-in-pipeline", type=int, default=0, metavar="STEPS",
                    help="only: train STEPS steps alone vs inside the pipeline flow (measurement 5)")
    ap.add_argument("--train-params", default=str(REPO / "params.yaml"), help="params for --train-in-pipeline (the main job)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the markdown tables on stdout (progress on stderr)."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.train_in_pipeline:
        work = Path(tempfile.mkdtemp(prefix="aiayn-bench-orch-"))
        _setup_env(args.mirror, work)
        try:
            print(f"{host_line()}; Python {platform.python_version()}.\n")
            print(bench_train_in_pipeline(work, args.train_params, args.train_in_pipeline, args.rounds, args.mirror))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    stages = [s for s in args.stages.split(",") if s]
    sub_stages = [s for s in args.subprocess_stages.split(",") if s]
    if unknown := [s for s in stages + sub_stages if s not in STAGES]:
        ap.error(f"unknown stage(s) {unknown}; choose from {STAGES}")

    work = Path(tempfile.mkdtemp(prefix="aiayn-bench-orch-"))
    _setup_env(args.mirror, work)
    from prefect import flow

    from aiayn.stages import Layout
    from benchmarks.tests_support.scratch import scratch_project

    try:
        with contextlib.redirect_stdout(sys.stderr):  # `dvc init` chatter
            root = scratch_project(work / "project", args.params)
        importlib.import_module("aiayn.stages.fetch").run(Layout(root), mirror=Path(args.mirror))
        for stage in STAGES:  # imports (torch, ...) outside the timings
            importlib.import_module(stage_module(stage))

        @flow(name="noop")
        def noop() -> None:
            """Nothing: the first flow call of a process pays the API start-up."""

        modes: dict[str, str | None] = {"temporary API": None}
        if args.server:
            modes[f"server {args.server}"] = args.server
        startup = {}
        for mode, url in modes.items():
            with _api(url):
                startup[mode] = _timed(noop)

        times = bench_in_process(root, stages, modes, args.rounds)
        wrapper = bench_wrapper(root, modes, args.wrapper_reps)
        sub = {mode: bench_subprocess(root, sub_stages, url) for mode, url in modes.items()} if args.subprocess else {}
        if set(stages) != set(STAGES):  # dvc.lock needs every stage's outputs
            bench_in_process(root, [s for s in STAGES if s not in stages], {}, 1)
        with contextlib.redirect_stdout(sys.stderr):
            cli_s, api_s = bench_noop_repro(root)

        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{host_line()}; Python {platform.python_version()}; "
              f"params {Path(args.params).name}; {args.rounds} round(s), medians.\n")
        for mode in modes:
            print(f"First flow call of a process ({mode}): {startup[mode]:.2f} s (one-off: API start-up or connection)\n")
            print(_table(f"Stages in-process: function vs flow ({mode})",
                         [(s, med[(s, "direct")], med[(s, mode)]) for s in stages]))
        print(f"### Wrapper only: a do-nothing stage as a flow (median of {args.wrapper_reps})\n")
        print(markdown_table(["API", "bare s", "flow s (= fixed per-stage overhead)"],
                             [[mode, f"{a:.3f}", f"{b:.2f}"] for mode, (a, b) in wrapper.items()], "lrr") + "\n")
        for mode, rows in sub.items():
            print(_table(f"As DVC runs a stage: fresh process, `aiayn <stage>` vs `python -m pipelines.run_stage` ({mode})",
                         rows, base="aiayn s", other="pipelines.run_stage s"))
        print("### No-op `dvc repro` (nothing changed)\n")
        print(markdown_table(["how", "s"], [["`dvc repro` (CLI process)", f"{cli_s:.2f}"],
                                            ["`Repo(root).reproduce()` (the pipeline flow's call)", f"{api_s:.2f}"]], "lr"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
