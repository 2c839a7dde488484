"""The ``pipeline`` flow: fetch -> ``dvc repro`` -> ``dvc push`` -> markdown report.

One run of this flow is one pipeline run:

1. **Tracking**: opens an MLflow record through ``aiayn.tracking.Tracker``
   (child run ``orchestrate`` under a fresh parent run) and exports the parent's id as
   ``AIAYN_PARENT_RUN_ID``, so every stage's run nests under the same parent. The
   parent ends with this flow (``FAILED`` if it fails). This flow's own run never stops
   the pipeline (an unreachable MLflow disables it, one warning), but the stages' runs are
   required: a stage whose store cannot be reached fails in one line (``TrackingLostError``).
0. **Check**: ``aiayn.config.checks.load_checked`` reports every problem of ``params.yaml`` at once
   (``aiayn check``) and fails the run before anything else happens.
2. **Fetch** (``io_task``, retried on transient I/O errors; Multi30k configs only: other corpus sources
   are read by the ``corpus`` stage): makes sure the verified raw corpus is in ``data/multi30k`` (files already there with the right hash are kept);
   then, when it matches ``data.dvc``, puts it in the DVC cache so the push uploads it. ``data.dvc``
   versions ``data/multi30k`` only (a corpus of one's own elsewhere, ``data/`` included, is outside it);
   data that differs from it (e.g. ``aiayn fetch --tok-references`` added ``data/multi30k/tok``) is
   re-versioned by ``dvc repro`` (DVC re-adds a changed data source), and the report says so.
3. **Reproduce**: ``dvc.repo.Repo(root).reproduce()``, so DVC alone decides what is
   stale. Each ``dvc.yaml`` cmd (``python -m pipelines.run_stage <name>``) runs its stage
   flow, reported to the same Prefect API as this flow (``PREFECT_API_URL`` exported),
   tagged ``pipeline-run:<flow run id>``; the venv's ``bin`` is put first on ``PATH``
   so ``python`` is this interpreter. A failed stage fails this flow with
   ``StageFailedError`` carrying the stage's own message.
4. **Push** (``io_task``, retried on ``OSError`` and DVC upload errors): ``Repo.push()``
   to the remote named by ``AIAYN_DVC_REMOTE`` (e.g. ``s3``, the team's bucket; its endpoint and
   credentials come from the usual AWS variables), else the default DVC remote. A project
   without a remote is *reported, not fatal*: the
   report says "not pushed" with DVC's reason. (The project's ``.dvc/config`` is where a
   remote belongs, e.g. ``dvc remote add -d local ../.dvc-remote``; this flow never edits it.)
4b. **Registration check** (``registration_check``): the export bundle is a version of its registered model
   in this run's MLflow store (``aiayn.stages.export.ensure_registered``, idempotent): DVC's run-cache
   restores the export stage's outputs without running it (treeverse/dvc#4551), and a new or emptied store
   would otherwise get no version (``aiayn serve``: no champion). Tracking on but the bundle not registered
   (an unreachable store, MLflow refused): the run ends ``Failed`` saying why, after the push and the report.
5. **Report**: a Prefect markdown artifact (key ``aiayn-pipeline-report``), whose FIRST line says when
   training was cut by the clock or a signal (``artifacts/train_metrics.json`` ``budget``): BLEU / chrF /
   lowercased-tokenized BLEU per test set with their sacreBLEU signatures
   (``artifacts/eval_metrics.json``, ``artifacts/eval/scores.json``), the MLflow run
   link, the raw data hash (``data.dvc`` / ``dvc.lock``), the stages DVC ran and the push result.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines import apply_project_env

apply_project_env()  # before Prefect is imported: it reads its settings once

from prefect import flow, get_client, get_run_logger, runtime, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.states import Failed, State  # noqa: E402

from aiayn.adaptation.adapt_plan import PARAMS_BACKUP, restore_interrupted_adaptation  # noqa: E402
from aiayn.config.checks import load_checked  # noqa: E402
from aiayn.exitcodes import EXIT_TRAINING_CUT, cut_warning_markdown, training_was_cut  # noqa: E402
from aiayn.host import host_info, matmul_gflops  # noqa: E402
from aiayn.provenance import CorpusInput, corpus_input, dvc_data_hashes  # noqa: E402
from aiayn.config.settings import PARENT_RUN_ENV, PIPELINE_RUN_ENV, STAGE_ERROR_FILE_ENV, Settings  # noqa: E402
from aiayn.stages import Layout  # noqa: E402
from aiayn.tracking import Tracker  # noqa: E402
from pipelines.flows import TRANSIENT_ERRORS, fetch_corpus, io_task  # noqa: E402

__all__ = ["main", "pipeline", "dvc_cache_data", "dvc_repro", "dvc_push", "registration_check", "publish_report",
           "render_report", "StageFailedError", "REPORT_KEY"]

#: Key of the markdown artifact (Prefect UI -> Artifacts); lowercase letters, digits, dashes.
REPORT_KEY = "aiayn-pipeline-report"


class StageFailedError(RuntimeError):
    """A ``dvc repro`` stage failed; the message carries the stage's own error."""


def _upload_error() -> tuple[type[BaseException], ...]:
    from dvc.exceptions import UploadError

    return (UploadError,)


@contextlib.contextmanager
def _environ(updates: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables inside the block; restore them after."""
    old = {k: os.environ.get(k) for k in updates}
    try:
        for k, v in updates.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _prefect_api_url() -> str:
    """URL of the Prefect API this flow reports to (a server, or the temporary local one)."""
    with get_client(sync_client=True) as client:
        return str(client.api_url).rstrip("/")


# --------------------------------------------------------------------------- tasks


@task(name="dvc-repro", cache_policy=NO_CACHE, persist_result=False)
def dvc_repro(root: str, env: dict[str, str | None]) -> list[str]:
    """Run ``dvc repro`` in ``root`` with ``env`` exported; return the stages DVC ran (never retried)."""
    from dvc.exceptions import ReproductionError
    from dvc.repo import Repo

    logger = get_run_logger()
    with tempfile.TemporaryDirectory(prefix="aiayn-repro-") as tmp:
        error_file = Path(tmp) / "stage-error.txt"
        with _environ({**env, STAGE_ERROR_FILE_ENV: str(error_file)}):
            try:
                # DVC's Python API resolves paths against the cwd (as `dvc` does after `--cd`)
                with contextlib.chdir(root), Repo(root) as repo:
                    stages = repo.reproduce()
            except ReproductionError as e:
                stage_message = error_file.read_text(encoding="utf-8").strip() if error_file.exists() else ""
                cause = f"{e}: {e.__cause__}" if e.__cause__ else str(e)
                raise StageFailedError(f"{stage_message} ({cause})" if stage_message else cause) from e
    ran = [stage.addressing for stage in stages]
    logger.info("dvc repro ran: %s", ", ".join(ran) if ran else "nothing (all stages up to date)")
    return ran


def _outs_present(dvc_file: Path) -> bool:
    """Every output a ``.dvc`` file versions exists in the workspace (a missing one cannot be cached)."""
    import yaml

    outs = (yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}).get("outs") or []
    return all((dvc_file.parent / o["path"]).exists() for o in outs if isinstance(o, dict) and "path" in o)


@task(name="dvc-cache-data", cache_policy=NO_CACHE, persist_result=False)
def dvc_cache_data(root: str) -> dict[str, str]:
    """Cache the data of each ``*.dvc`` file that matches its recorded hash, so ``dvc push`` uploads it.

    Returns ``{".dvc file": "up to date" | "cached" | "not in the workspace (...)" | "differs from its .dvc
    file: <dvc status>"}``; a ``.dvc`` file whose data is absent (``data.dvc``'s Multi30k when the run reads
    another corpus) is skipped. Data that differs is reported (warning) and not committed here; the
    ``dvc repro`` after it re-adds it (``re_versioned`` then corrects the status for the report).
    """
    from dvc.repo import Repo
    from dvc.stage.exceptions import StageCommitError

    logger = get_run_logger()
    result: dict[str, str] = {}
    dvc_files = sorted(p.name for p in Path(root).glob("*.dvc") if p.is_file())
    if not dvc_files:
        return result
    with contextlib.chdir(root), Repo(root) as repo:
        for name in dvc_files:
            if not _outs_present(Path(root) / name):  # e.g. data/multi30k with another corpus configured
                result[name] = "not in the workspace (unused by this run: nothing to cache)"
                continue
            changes = repo.status(targets=[name]).get(name, [])
            kinds = {v for change in changes for v in (change.get("changed outs") or {}).values()}
            only_uncached = bool(changes) and kinds == {"not in cache"} and all(set(c) == {"changed outs"} for c in changes)
            if not changes:
                result[name] = "up to date"
                continue
            if only_uncached:
                # "not in cache" says nothing of the workspace (DVC cannot compare a directory whose recorded
                # manifest it lacks): commit without force, which refuses data whose hash moved.
                try:
                    repo.commit(name)  # same hash: only fills the cache, the .dvc file is unchanged
                    result[name] = "cached"
                    continue
                except StageCommitError as exc:
                    changes = [{"changed outs": "modified (its hash is not the recorded one)", "dvc": str(exc)}]
            result[name] = f"differs from its .dvc file: {changes}"
            logger.warning("%s: %s (dvc repro will record its new version in %s)", name, result[name], name)
    return result


def re_versioned(data_status: dict[str, str], ran: list[str]) -> dict[str, str]:
    """``data_status`` (``dvc_cache_data``) after ``dvc repro`` ran the stages ``ran``: DVC re-adds a data
    source whose data changed, so a ``.dvc`` file among ``ran`` now records the new data."""
    return {name: (f"re-versioned by dvc repro: its data changed (`git diff {name}` shows the new version, "
                   f"`git checkout {name}` restores the committed one)" if name in ran else status)
            for name, status in data_status.items()}


@io_task(name="dvc-push", transient=TRANSIENT_ERRORS + _upload_error())
def dvc_push(root: str) -> dict[str, Any]:
    """Push DVC-tracked data and outputs to the remote named by ``AIAYN_DVC_REMOTE``, else the default
    remote; no default remote is reported, not raised. A named remote that ``.dvc/config`` lacks raises
    DVC's ``RemoteNotFoundError`` (a misconfiguration, never a silent skip)."""
    from dvc.config import NoRemoteError
    from dvc.repo import Repo

    logger = get_run_logger()
    with contextlib.chdir(root), Repo(root) as repo:
        remote = Settings.from_env().dvc_remote or repo.config["core"].get("remote")
        try:
            pushed = repo.push(remote=remote)
        except NoRemoteError as e:
            logger.warning("not pushed: %s", e)
            return {"pushed": None, "remote": None, "reason": str(e).strip()}
    logger.info("pushed %d file(s) to DVC remote %r", pushed, remote)
    return {"pushed": pushed, "remote": remote, "reason": None}


@task(name="registration-check", cache_policy=NO_CACHE, persist_result=False)
def registration_check(params: Any, layout: Layout, tracker: Tracker) -> dict[str, Any]:
    """After ``dvc repro``: ``aiayn.stages.export.ensure_registered`` through the flow's ``tracker`` (module doc,
    step 4b). Returns ``{"status", "version", "alias", "why"}``: status ``registered``, ``already registered``,
    ``off`` (tracking turned off: nothing to check) or ``failed`` (tracking on, the bundle is not registered;
    ``why`` says why)."""
    from aiayn.stages.export import ensure_registered

    logger = get_run_logger()
    if not tracker.active and tracker.disabled_reason is None:
        return {"status": "off", "version": None, "alias": None, "why": "tracking is turned off"}
    out = ensure_registered(params, layout, tracker) if tracker.active else None
    if out is None:
        why = f"{layout.export} is not registered in {tracker.tracking_uri}: {tracker.disabled_reason}"
        logger.error("registration check: %s", why)
        return {"status": "failed", "version": None, "alias": None, "why": why}
    status = "already registered" if out.get("already_registered") else "registered"
    logger.info("registration check: %s as version %s (%s)", status, out["version"], out["alias"])
    return {"status": status, "version": out["version"], "alias": out["alias"], "why": None}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e


def _data_hashes(root: Path) -> dict[str, str] | str:
    """``aiayn.provenance.dvc_data_hashes(root)``, or why they could not be read (the report says so)."""
    try:
        return dvc_data_hashes(root)
    except (OSError, ValueError) as e:
        get_run_logger().warning("data hashes unavailable: %s: %s", type(e).__name__, e)
        return f"unavailable ({type(e).__name__}: {e})"


def render_report(
    *,
    metrics: dict[str, dict[str, float]] | None,
    scores: dict[str, Any] | None,
    data_hashes: dict[str, str] | str,
    data_status: dict[str, str] | None = None,
    mlflow_link: str | None,
    ran: list[str],
    push: dict[str, Any] | None,
    title: str = "aiayn pipeline run",
    training: dict[str, Any] | None = None,
    timing: dict[str, Any] | None = None,
    corpus: CorpusInput | None = None,
) -> str:
    """Markdown for the pipeline report (pure function of its inputs).

    ``metrics``: ``{split: {"bleu", "chrf", "bleu_lc_tok"}}`` (0-100, sacreBLEU);
    ``scores``: ``artifacts/eval/scores.json`` (``{split: {..., "bleu_signature", ...}}``);
    ``data_hashes``: ``{path: dvc md5}`` or why they are unavailable; ``data_status``: the
    ``dvc_cache_data`` result; ``push``: the ``dvc_push`` result or None (skipped); ``training``:
    ``artifacts/train_metrics.json`` (its ``budget`` line opens the report: a run cut by the clock or a
    signal says so before anything else, since its scores are not the configured model's); ``timing``:
    ``{"repro_s": seconds of dvc repro, "host": aiayn.host.HostInfo.line() before it, "gflops_after": the
    matmul probe after it}`` (hosts of one kind differ ~2x in speed, so a timing carries its host);
    ``corpus``: the corpus the run read, ``aiayn.provenance.corpus_input`` (its path and hash are the data line,
    inside the project or not; None, before the corpus stage has run: every hash under ``data/``).
    """
    budget = (training or {}).get("budget")
    lines = cut_warning_markdown(budget)
    lines += [f"# {title}", ""]
    if budget:
        lines += [f"Training: {budget}" + (f"; model: {_selection_text(training)}" if training.get("selection") else ""),
                  ""]
    if metrics:
        lines += ["| test set | BLEU | chrF | BLEU (lc, tok) |", "|---|---:|---:|---:|"]
        for split, m in metrics.items():
            lines.append(f"| {split} | {m['bleu']:.2f} | {m['chrf']:.2f} | {m['bleu_lc_tok']:.2f} |")
        signatures: dict[str, str] = {}
        for split in metrics:
            entry = (scores or {}).get(split) or {}
            for name in ("bleu", "chrf", "bleu_lc_tok"):
                if sig := entry.get(f"{name}_signature"):
                    signatures.setdefault(name, sig)
        if signatures:
            lines += ["", "sacreBLEU signatures:", ""]
            lines += [f"- {name}: `{sig}`" for name, sig in signatures.items()]
    else:
        lines.append("No evaluation metrics (artifacts/eval_metrics.json missing).")
    lines += ["", "## Provenance", ""]
    lines.append(f"- MLflow run: {mlflow_link}" if mlflow_link else "- MLflow run: not tracked (tracking off or unreachable)")
    if isinstance(data_hashes, str):
        lines.append(f"- data: hash {data_hashes}")
    elif corpus and corpus.md5:
        lines.append(f"- data `{corpus.path}` (the corpus this run read): md5 `{corpus.md5}`")
    elif raw := {p: h for p, h in data_hashes.items() if p == "data" or p.startswith("data/")}:
        lines += [f"- data `{p}`: md5 `{h}`" for p, h in sorted(raw.items())]
    else:
        lines.append("- data: no DVC hash yet (no data.dvc and no dvc.lock entry under data/)")
    lines += [f"- `{name}`: {status}" for name, status in (data_status or {}).items()]
    lines.append(f"- DVC reproduced: {', '.join(ran)}" if ran else "- DVC reproduced: nothing (all stages up to date)")
    if timing:
        lines.append(f"- time: DVC stages {timing['repro_s']:.0f} s ({timing['repro_s'] / 60:.1f} min) on "
                     f"{timing['host']} before, {timing['gflops_after']:.0f} after")
    if push is None:
        lines.append("- DVC remote: push skipped")
    elif push.get("pushed") is None:
        lines.append(f"- DVC remote: not pushed ({push.get('reason')})")
    else:
        lines.append(f"- DVC remote `{push['remote']}`: pushed {push['pushed']} file(s)")
    return "\n".join(lines) + "\n"


def _selection_text(training: dict[str, Any]) -> str:
    sel = training["selection"]
    what = "a single checkpoint" if sel.get("kind") == "single" else "an average of checkpoints"
    return f"{what} ({sel.get('method')}{', replaced by the validated choice' if sel.get('replaced') else ''})"


@task(name="publish-report", cache_policy=NO_CACHE, persist_result=False)
def publish_report(markdown: str) -> str:
    """Publish ``markdown`` as the Prefect artifact ``aiayn-pipeline-report``; return its id."""
    artifact_id = create_markdown_artifact(
        markdown=markdown, key=REPORT_KEY, description="BLEU/chrF per test set, MLflow run, data hash"
    )
    return str(artifact_id)


# --------------------------------------------------------------------------- flow


@flow(name="pipeline", log_prints=True)
def pipeline(root: str = ".", push: bool = True, mirror: str | None = None) -> dict[str, Any] | State:
    """Fetch, ``dvc repro``, ``dvc push`` and publish the markdown report for the project at ``root``.
    Returns the run's summary; when training was cut by the clock or a signal, a ``Failed`` state holding
    it (``state.result(raise_on_failure=False)``), so a scheduled run that was cut shows as failed."""
    root_path = Path(root).resolve()
    layout = Layout(root_path)
    if restore_interrupted_adaptation(root_path):  # a killed adapt run left params.yaml adapted
        get_run_logger().warning("params.yaml was left adapted by a killed adapt run: put back from %s", PARAMS_BACKUP)
    params = load_checked(root_path / "params.yaml", root_path)  # every problem at once, before any stage
    with Tracker("orchestrate", project_root=root_path, end_pipeline=True) as tracker:
        tracker.set_tags({"prefect.flow_run_id": str(runtime.flow_run.id)})
        if params.data.corpus.kind == "multi30k":  # other sources are read by the corpus stage itself
            fetch_corpus(layout, mirror)
        env: dict[str, str | None] = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "PREFECT_API_URL": _prefect_api_url(),
            PIPELINE_RUN_ENV: str(runtime.flow_run.id),
            PARENT_RUN_ENV: tracker.parent_run_id,
            "DVC_NO_ANALYTICS": "1",
        }
        data_status = dvc_cache_data(str(root_path))
        host, t0 = host_info(), time.perf_counter()  # the timing's host: probed idle, before and after
        ran = dvc_repro(str(root_path), env)
        timing = {"repro_s": time.perf_counter() - t0, "host": host.line(), "gflops_after": matmul_gflops()}
        data_status = re_versioned(data_status, ran)
        tracker.refresh_lineage()  # the stages rewrote dvc.lock: the corpus they read, their outputs' hashes
        pushed = dvc_push(str(root_path)) if push else None
        registration = registration_check(params, layout, tracker)

        mlflow_link = tracker.parent_run_url()
        training, hashes = _read_json(layout.train_metrics), _data_hashes(root_path)
        markdown = render_report(
            metrics=_read_json(layout.eval_metrics),
            scores=_read_json(layout.eval / "scores.json"),
            data_hashes=hashes,
            data_status=data_status,
            mlflow_link=mlflow_link,
            ran=ran,
            push=pushed,
            title=f"aiayn pipeline run {runtime.flow_run.name}",
            training=training,
            timing=timing,
            corpus=None if isinstance(hashes, str) else corpus_input(root_path),  # the lock parsed: readable
        )
        markdown += (f"- model registry: {registration['status']}" + (f" (version {registration['version']}, "
                     f"{registration['alias']})" if registration["version"] else f": {registration['why']}") + "\n")
        artifact_id = publish_report(markdown)
        parent_run_id = tracker.parent_run_id
        if tracker.active:
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "pipeline_report.md"
                report.write_text(markdown, encoding="utf-8")
                tracker.log_artifact(report)
    result = {
        "data": data_status,
        "ran": ran,
        "push": pushed,
        "mlflow_run": parent_run_id,
        "mlflow_link": mlflow_link,
        "artifact_id": artifact_id,
        "report": markdown,
        "training_budget": (training or {}).get("budget"),
        "registration": registration,
    }
    return final_result(result)


def final_result(result: dict[str, Any]) -> dict[str, Any] | State:
    """What the flow returns: ``result``, or when training was cut (``result["training_budget"]`` starts with
    ``CUT``) a ``Failed`` state holding it — a cut run is a failure (a scheduled run shows Failed), and
    everything it made is kept and reported. Likewise when the registration check failed
    (``result["registration"]["status"] == "failed"``): its message says why."""
    registration = result.get("registration") or {}
    unregistered = (f"the export bundle is not registered: {registration['why']}"
                    if registration.get("status") == "failed" else None)
    if _training_cut(result):
        return Failed(message=f"training was {result['training_budget']}: every stage ran and the report is "
                      "published, but the model is not the configured one"
                      + (f"; {unregistered}" if unregistered else ""), data=result)
    if unregistered:
        return Failed(message=f"{unregistered} (every stage ran, the report is published)", data=result)
    return result


def _training_cut(result: Any) -> bool:
    return isinstance(result, dict) and training_was_cut(result.get("training_budget"))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.pipeline [--root DIR] [--no-push] [--mirror DIR]``: one pipeline run; exit 1 if it
    failed, ``aiayn.exitcodes.EXIT_TRAINING_CUT`` (3) if every stage ran but training was cut by the clock or
    a signal (the report says so first), else 0."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pipelines.pipeline", description=pipeline.description)
    parser.add_argument("--root", default=".", help="project root (default: current directory)")
    parser.add_argument("--no-push", dest="push", action="store_false", help="skip `dvc push`")
    parser.add_argument("--mirror", default=None, help="local corpus folder (default: $AIAYN_DATA_MIRROR)")
    args = parser.parse_args(argv)
    state = pipeline(root=args.root, push=args.push, mirror=args.mirror, return_state=True)
    if state.is_completed():
        print(state.result()["report"])
        return 0
    result = state.result(raise_on_failure=False)
    if state.is_failed() and _training_cut(result):
        print(result["report"])
        print(f"pipeline finished, but training was {result['training_budget']} (exit {EXIT_TRAINING_CUT})",
              file=sys.stderr)
        return EXIT_TRAINING_CUT
    print(f"pipeline failed: {state.message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
