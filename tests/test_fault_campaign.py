"""The fault campaign: ``kill -9`` at a point inside each pipeline stage's writes, then a plain ``dvc repro``
recovers the uninterrupted run's bytes. (The service, a full disk, the tracking server: ``test_fault_injection``.)

**Kill points** (``aiayn.faults``): ``AIAYN_FAULT_POINT=<point>[@N]`` makes the process that reaches the
point (the N-th time) SIGKILL itself there. ``CAMPAIGN`` names one or two points per stage, in DAG order
(the multi-file writes, a checkpoint, a CTranslate2 model folder and the serving bundle, twice). The
uninterrupted run is the session's smoke pipeline (``smoke_pipeline``). Each of two chains (``CHAINS``, run at
once) works on a copy of it without the outputs of its stages and later ones (from ``corpus``: no ``artifacts/``
at all, the checkpoints included) and without what DVC would restore them from (so each of its stages really
runs): ``dvc repro`` once per point with
that point armed reruns the stage the previous point killed (its own points are inert there) and dies (-9) at
the next point; a last, plain ``dvc repro`` recovers the last stage. The two kills of one stage follow each
other: the run after the first kill is the one the second kills, so the recovery starts from what both left.

Once a stage has recovered: each of its outputs (``dvc.yaml``'s outs and metrics) has the uninterrupted run's
bytes (sha256 of every file; training is bitwise deterministic on one host with the same seeds, and resumes
from its last complete checkpoint), nothing half-written is left (no temporary file or folder, no checkpoint
tensor file without its JSON), and the MLflow runs the kill left ``RUNNING`` are ended. The table (one row per
point) is printed (``-s``): docs/operations.md's "Fault campaign" holds it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from aiayn.config.settings import FAULT_POINT_ENV, PARENT_RUN_ENV, TRACKING_ENV

pytestmark = pytest.mark.faults

BIN = Path(sys.executable).parent
#: Bounds a hang only (a test waits on events and states, never on elapsed time).
HANG_S = 900
#: (stage, kill point) in DAG order: each stage once, the multi-file writes (a checkpoint: its tensor file and
#: the JSON that commits it; a CTranslate2 model folder; the serving bundle) twice. ``name@N``: the N-th time.
CAMPAIGN = (
    ("corpus", "corpus.snapshot_written"),
    ("prepare", "prepare.folder_swapped"),
    ("tokenize", "tokenize.split_encoded"),
    ("train", "checkpoint.tensors_unrenamed"),
    ("train", "checkpoint.tensors_written@2"),
    ("evaluate", "evaluate.metrics_written"),
    ("quantize", "quantize.ct2_converted"),
    ("quantize", "quantize.variant_unrecorded"),
    ("export", "bundle.model_copied"),
    ("export", "atomic_dir:export"),
    ("monitor_reference", "monitor_reference.tensors_written"),
)
#: The campaign as two chains that run at once, each on its own copy (one stage process each: the host's two
#: cores; about the same time each): corpus .. evaluate from no output at all, quantize .. monitor_reference
#: from the uninterrupted run's outputs up to evaluate. (first stage, last stage) of each.
CHAINS = (("corpus", "evaluate"), ("quantize", "monitor_reference"))


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def outs(root: Path, stage: str) -> list[Path]:
    """``stage``'s outputs (``dvc.yaml``: outs and metrics)."""
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]
    return [root / (e if isinstance(e, str) else next(iter(e))) for e in [*spec.get("outs", []), *spec.get("metrics", [])]]


def stage_outputs(root: Path, stage: str) -> dict[str, str]:
    """sha256 of every file of ``stage``'s outputs, by path under ``root``."""
    found: dict[str, str] = {}
    for out in outs(root, stage):
        files = sorted(p for p in out.rglob("*") if p.is_file()) if out.is_dir() else [out] if out.exists() else []
        found |= {str(p.relative_to(root)): sha256(p) for p in files}
    return found


def litter(root: Path, stage: str | None = None) -> list[str]:
    """What a write cut short leaves (``stage``'s outputs and their siblings; None: all of ``artifacts/``): a
    temporary file or folder (``aiayn.io``), a folder set aside in a swap, a checkpoint's tensor file without its
    JSON commit marker or the reverse (the train stage's checkpoints)."""
    def cut(p: Path) -> bool:
        return p.name.endswith(".tmp") or ".old." in p.name

    art, ckpts = root / "artifacts", root / "artifacts" / "checkpoints"
    if stage is None:
        found = {p for p in art.rglob("*") if cut(p)}
    else:
        found = {p for out in outs(root, stage) for p in [*out.parent.glob(f".{out.name}.*"),
                                                           *(out.rglob("*") if out.is_dir() else ())] if cut(p)}
        found |= {p for p in ckpts.glob("*") if cut(p)} if stage == "train" and ckpts.is_dir() else set()
    left = [str(p.relative_to(root)) for p in found]
    for p in ckpts.glob("ckpt_*") if (stage in (None, "train") and ckpts.is_dir()) else ():
        if not p.with_suffix(".json" if p.suffix == ".safetensors" else ".safetensors").exists():
            left.append(f"{p.relative_to(root)} (alone)")
    return sorted(left)


def runs(root: Path) -> dict[str, tuple[str, str]]:
    """Every run of the project's MLflow store: run id -> (status, ``aiayn.stage`` tag or the run's kind)."""
    db = root / "mlflow.db"
    if not db.exists():
        return {}
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT r.run_uuid, r.status, coalesce(s.value, k.value, '') FROM runs r "
                           "LEFT JOIN tags s ON s.run_uuid = r.run_uuid AND s.key = 'aiayn.stage' "
                           "LEFT JOIN tags k ON k.run_uuid = r.run_uuid AND k.key = 'aiayn.kind'").fetchall()
    finally:
        con.close()
    return {run_id: (status, stage) for run_id, status, stage in rows}


#: DVC runs a stage's command through ``$SHELL -c`` (``/bin/sh`` when unset, as on CI). bash ``exec``s a lone
#: command, so DVC sees the stage process's own death, ``-9``; dash waits for it and exits 128 + 9 = ``137``.
#: Both are a SIGKILL; the test runs under ``/bin/sh`` (a user's shell is either) so a host's login shell does
#: not pick which one it meets.
STAGE_SHELL = "/bin/sh"
KILLED = re.compile(r"failed to reproduce '([^']+)': failed to run: .*, exited with (?:-9|137)\b")


def killed_in(text: str) -> str | None:
    """The stage ``dvc repro``'s output says was killed by SIGKILL (either way a shell reports it), or None."""
    found = KILLED.search(text)
    return found.group(1) if found else None


def repro(root: Path, env: dict, point: str | None, *targets: str) -> subprocess.CompletedProcess:
    """``dvc repro [targets]`` in ``root``; ``point``: the kill point armed in every stage process it starts."""
    run_env = {k: v for k, v in env.items() if k != FAULT_POINT_ENV} | ({FAULT_POINT_ENV: point} if point else {})
    run_env["SHELL"] = STAGE_SHELL
    return subprocess.run([str(BIN / "dvc"), "repro", *targets], cwd=root, env=run_env, capture_output=True,
                          text=True, timeout=HANG_S)


def _stages_done(proc: subprocess.CompletedProcess) -> set[str]:
    """The stages ``dvc repro`` ran to the end: those it started, less the one that failed."""
    text = proc.stdout + proc.stderr
    return set(re.findall(r"Running stage '([^']+)'", text)) - set(re.findall(r"failed to reproduce '([^']+)'", text))


class Chain:
    """One chain of the campaign on its own copy ``root`` of the uninterrupted project ``base``: a ``dvc repro``
    per kill point, then a plain one; ``rows`` is its part of the table, checked as its stages recover."""

    def __init__(self, base: Path, root: Path, env: dict, cases: tuple, last: str) -> None:
        self.base, self.root, self.env, self.cases, self.last = base, root, env, cases, last
        self.rows: list[dict] = []
        self.ran: set[str] = set()  # every stage a repro started
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for stage, point in self.cases:
                before = runs(self.root)
                proc = repro(self.root, self.env, point)
                text = proc.stdout + proc.stderr
                self.ran |= set(re.findall(r"Running stage '([^']+)'", text))
                assert proc.returncode != 0 and killed_in(text) == stage, \
                    f"{point}: dvc repro should have died (SIGKILL) in {stage}\n{text[-4000:]}"
                open_runs = [r for r, (st, s) in runs(self.root).items() if st == "RUNNING" and s == stage and r not in before]
                self.rows.append({"stage": stage, "point": point, "open_runs": open_runs, "checked": False})
                self.check(_stages_done(proc))
            proc = repro(self.root, self.env, None, self.last)  # plain: nothing armed
            assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            self.ran |= set(re.findall(r"Running stage '([^']+)'", proc.stdout + proc.stderr))
            self.check(_stages_done(proc))
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            self.error = e

    def check(self, done: set[str]) -> None:
        """Check every row whose stage ran to its end since its kill."""
        for row in self.rows:
            if row["checked"] or row["stage"] not in done:
                continue
            got, want = stage_outputs(self.root, row["stage"]), stage_outputs(self.base, row["stage"])
            status = runs(self.root)
            row.update(checked=True, files=len(want), same=bool(want) and got == want,
                       differ=sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k)),
                       litter=litter(self.root, row["stage"]),
                       still_running=[r for r in row["open_runs"] if status[r][0] == "RUNNING"],
                       ended=sorted({status[r][0] for r in row["open_runs"]}))


def table(rows: list[dict]) -> str:
    lines = ["| stage | kill point | recovered | bytes compared | run left RUNNING |", "|---|---|---|---|---|"]
    for r in rows:
        ok = r["checked"] and r["same"] and not r["litter"]
        ended = f"no ({len(r['open_runs'])} open at the kill, then {'/'.join(r['ended'])})" if r["open_runs"] else \
            "no (none open at the kill)"
        lines.append(f"| {r['stage']} | `{r['point']}` | {'yes' if ok else 'NO'} | yes ({r.get('files', 0)} files, "
                     f"sha256) | {'YES' if r.get('still_running') else ended} |")
    return "\n".join(lines)


def _forget(root: Path, stages: list[str]) -> None:
    """Remove from ``root``'s DVC cache what would let ``dvc repro`` check ``stages``' outputs out instead of
    running them: their folders' ``.dir`` objects (the listing DVC restores a folder from; the files' objects
    stay, shared with other outputs as they may be) and the run cache. A stage killed before its end has none
    of these: this is that state. The stages before them stay up to date (their outputs are still cached)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    for stage in stages:
        for out in lock[stage].get("outs", []):
            md5 = out.get("md5", "")
            if md5.endswith(".dir"):
                (root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).unlink()
    shutil.rmtree(root / ".dvc" / "cache" / "runs", ignore_errors=True)


def _chain_copy(base: Path, dest: Path, first: str) -> Path:
    """A copy of ``base`` without the outputs of ``first`` and every stage after it (from the first stage:
    without ``artifacts/``, the checkpoints included, so training starts from scratch), ``_forget`` done."""
    from pipelines.dag import STAGES
    from support.scratch import copy_project

    root = copy_project(base, dest)
    rerun = list(STAGES[STAGES.index(first):])
    _forget(root, rerun)
    if first == STAGES[0]:
        shutil.rmtree(root / "artifacts")
    for stage in rerun:
        for out in outs(root, stage):
            shutil.rmtree(out) if out.is_dir() else out.unlink(missing_ok=True)
    return root


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
def test_a_stage_killed_by_sigkill_is_read_as_killed_under_either_shell(tmp_path, shell):
    """dvc repro of a stage that SIGKILLs itself, its command run by dash (DVC sees 137) or bash (-9)."""
    if not Path(shell).exists():
        pytest.fail(f"{shell} is missing: the campaign reads DVC's report of a stage run through it")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"dies": {
        "cmd": f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'",
        "outs": ["out.txt"]}}}))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": shell, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True, timeout=HANG_S)
    proc = subprocess.run([str(BIN / "dvc"), "repro"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S)
    assert proc.returncode != 0
    assert killed_in(proc.stdout + proc.stderr) == "dies", proc.stdout + proc.stderr
    assert killed_in("ERROR: failed to reproduce 'dies': failed to run: x, exited with 1") is None


@pytest.mark.timeout(2400)
def test_kill_9_inside_each_stage_s_writes_and_dvc_repro_recovers_the_same_bytes(smoke_pipeline, tmp_path):
    from pipelines.dag import STAGES

    base = smoke_pipeline["root"]
    env = {k: v for k, v in smoke_pipeline["env"].items() if k not in (PARENT_RUN_ENV, TRACKING_ENV)}
    chains = []
    for first, last in CHAINS:
        span = STAGES[STAGES.index(first):STAGES.index(last) + 1]
        cases = tuple((s, p) for s, p in CAMPAIGN if s in span)
        chains.append(Chain(base, _chain_copy(base, tmp_path / first, first), env, cases, last))
    assert [c for chain in chains for c in chain.cases] == list(CAMPAIGN)
    assert list(STAGES) == list(dict.fromkeys(s for s, _ in CAMPAIGN))  # every stage, in DAG order
    t0 = time.monotonic()
    threads = [threading.Thread(target=chain.run) for chain in chains]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    rows = [row for chain in chains for row in chain.rows]
    print(f"\nfault campaign: {len(rows)} kill points, {seconds:.0f} s (two chains at once)\n{table(rows)}\n")
    for chain in chains:
        if chain.error is not None:
            raise chain.error
    for row in rows:
        assert row["checked"], f"{row['point']}: {row['stage']} never ran again\n{table(rows)}"
        assert row["same"], f"{row['point']}: {row['stage']}'s outputs differ: {row['differ']}\n{table(rows)}"
        assert not row["litter"], f"{row['point']}: left behind {row['litter']}\n{table(rows)}"
        assert not row["still_running"], f"{row['point']}: runs left RUNNING {row['still_running']}\n{table(rows)}"
    for chain in chains:
        assert chain.ran == {s for s, _ in chain.cases}, chain.ran  # its own stages, none before them
        assert litter(chain.root) == []
        status = subprocess.run([str(BIN / "dvc"), "status", "--json", chain.last], cwd=chain.root, env=env,
                                capture_output=True, text=True, timeout=HANG_S)
        assert json.loads(status.stdout or "{}") == {}, status.stdout  # up to date through its last stage
        state = json.loads((chain.root / ".aiayn" / "pipeline_run.json").read_text()) \
            if chain.last != STAGES[-1] else {"run_id": None}
        running = [r for r, (st, _) in runs(chain.root).items() if st == "RUNNING"]
        # the pipeline's last stage ends its pipeline run; a chain that stops before keeps its current one open
        assert running == ([state["run_id"]] if state["run_id"] else []), (running, state)
