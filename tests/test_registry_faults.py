"""The model registry under faults (docs/serving.md, "Registry under faults"), each on a local SQLite
MLflow store with a tiny bundle (tests/support/tiny.py):

1. two exports registering at once (mlflow#22635): one consistent champion, both versions kept;
2. a create whose response was lost, retried (mlflow#4764): no duplicate version;
3. DVC's run-cache skips the export stage (treeverse/dvc#4551): the pipeline registers the bundle in an
   empty store after ``dvc repro`` says "up to date", or fails saying why;
4. a truncated artifact (mlflow#8104): refused with a clear error, never served.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from support import tiny  # noqa: E402
from aiayn.export.bundle import build_bundle, register_bundle  # noqa: E402
from aiayn.inference.artifacts import EAGER, read_bundle_info  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402
from aiayn.serving.config import ServeConfig  # noqa: E402
from aiayn.serving.model_source import load_model  # noqa: E402
from aiayn.tracking import CHAMPION, RegistryError, Tracker  # noqa: E402
from aiayn.tracking import registry as reg  # noqa: E402

NAME = "aiayn-en-de"
SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
OPTIONS = DecodeOptions(beam_size=1, max_len_b=6)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tokenizer, a tiny model and two serving bundles of it (CTranslate2 float32 and eager)."""
    root = tmp_path_factory.mktemp("registry-faults")
    tok = tiny.tokenizer(root)
    layout = tiny.project(root / "proj", tok)
    ct2 = tiny.ct2_bundle(root, layout, tok, OPTIONS)
    eager = build_bundle(root / "bundle-eager", model_dir=layout.model, variant=EAGER, variant_dir=None,
                         compute_type=None, decode=OPTIONS, card=tiny.CARD)
    return {"root": root, "tok": tok, "layout": layout, "ct2": ct2, "eager": eager}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI", "AIAYN_REGISTERED_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _store(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'mlflow.db').as_posix()}"


def _register(store: str, root: Path, bundle: Path, bleu: float) -> dict | None:
    """What the export stage does: one stage run that registers ``bundle`` with gate BLEU ``bleu``."""
    with Tracker("export", project_root=root, tracking_uri=store, end_pipeline=True) as t:
        return register_bundle(t, bundle, name=NAME, variant=read_bundle_info(bundle)["variant"], gate_split="test_a",
                               bleu=bleu, example=["a man"], provenance={"git_commit": "c0ffee"})


def _versions(store: str) -> list:
    found = MlflowClient(tracking_uri=store).search_model_versions(f"name='{NAME}'")
    return sorted(found, key=lambda v: int(v.version))


# --------------------------------------------------------------------------- 1. concurrent registrations


@pytest.mark.parametrize("lock", ["file", "registry"])
def test_two_concurrent_registrations_leave_one_consistent_champion(world, tmp_path, monkeypatch, lock):
    """Both exports read "no champion" before either writes, and the worse one writes last: without a
    serialised read-decide-write its version ends up champion. ``lock="registry"``: the lock a remote
    tracking server gets (no file beside the store), forced on the SQLite store."""
    store = _store(tmp_path / "store")
    if lock == "registry":
        from aiayn.tracking import registry_lock

        monkeypatch.setattr(registry_lock, "file_lock_path", lambda tracking_uri: None)
    with Tracker("export", project_root=tmp_path / "warm", tracking_uri=store):
        pass  # the experiment exists before the two exports start (its creation is not the race here)
    real, arrived, both = reg.choose_alias, [], threading.Event()

    def racing(new_bleu, champion_bleu, **kw):
        arrived.append(new_bleu)
        if len(arrived) == 2:
            both.set()
        both.wait(3.0)  # unserialised: each has read the champion before either writes
        if new_bleu < 35.0:
            time.sleep(1.0)  # the worse version writes last
        return real(new_bleu, champion_bleu, **kw)

    monkeypatch.setattr(reg, "choose_alias", racing)
    results: dict[float, dict | None] = {}
    jobs = [threading.Thread(target=lambda b=bleu, bundle=bundle, root=tmp_path / name:
                             results.__setitem__(b, _register(store, root, bundle, b)))
            for bleu, bundle, name in ((35.0, world["ct2"], "a"), (32.0, world["eager"], "b"))]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join(120)
    versions = _versions(store)
    assert sorted(float(v.tags["bleu.test_a"]) for v in versions) == [32.0, 35.0], "both versions must exist"
    assert all(results.get(b) for b in (35.0, 32.0)), f"a registration failed: {results}"
    champion = MlflowClient(tracking_uri=store).get_model_version_by_alias(NAME, CHAMPION)
    assert float(champion.tags["bleu.test_a"]) == 35.0, (
        f"champion is version {champion.version} (BLEU {champion.tags['bleu.test_a']}), not the best of {results}")


def test_a_lease_held_too_long_times_out_and_an_abandoned_one_is_broken(tmp_path, monkeypatch):
    """The remote store's lock: a lease someone holds makes a writer wait, then give up naming it; one
    older than ``LEASE_TTL_S`` (its holder died) is broken; the holder's release leaves no lock model."""
    from aiayn.tracking import registry_lock

    store = _store(tmp_path / "store")
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    monkeypatch.setattr(registry_lock, "file_lock_path", lambda tracking_uri: None)
    client.create_registered_model(NAME + registry_lock.LOCK_MODEL_SUFFIX)  # a holder that never released it
    with pytest.raises(registry_lock.RegistryLockTimeout, match="still held"):
        with registry_lock.model_lock(client, NAME, store, wait_s=0.5):
            pass
    monkeypatch.setattr(registry_lock, "LEASE_TTL_S", 0.0)  # now it counts as abandoned
    with registry_lock.model_lock(client, NAME, store, wait_s=5):
        assert [m.name for m in client.search_registered_models()] == [NAME + registry_lock.LOCK_MODEL_SUFFIX]
    assert client.search_registered_models() == []


# --------------------------------------------------------------------------- 2. a lost response, retried


@pytest.mark.parametrize("fault", ["lost-response", "transport-retry"])
def test_a_create_whose_response_was_lost_is_not_duplicated(world, tmp_path, monkeypatch, fault):
    """The server created the version but the client never heard back. ``lost-response``: the call raises
    a timeout, and the registration retries. ``transport-retry``: MLflow's HTTP layer retried the POST on
    its own (mlflow#4764), so one call created two versions."""
    import requests

    store = _store(tmp_path / "store")
    real, calls = MlflowClient.create_model_version, []

    def flaky(self, *args, **kwargs):
        calls.append(kwargs.get("tags"))
        if len(calls) > 1:
            return real(self, *args, **kwargs)
        real(self, *args, **kwargs)  # created server-side ...
        if fault == "transport-retry":
            return real(self, *args, **kwargs)  # ... and again by the transport's retry
        raise requests.exceptions.ReadTimeout("read timed out")  # ... but the response was lost

    monkeypatch.setattr(MlflowClient, "create_model_version", flaky)
    out = _register(store, tmp_path / "p", world["ct2"], 30.0)
    assert [str(v.version) for v in _versions(store)] == ["1"], "the lost response made a duplicate version"
    assert out is not None, "the registration gave up after the lost response (see the warning)"
    assert out["version"] == "1" and out["alias"] == CHAMPION
    assert str(MlflowClient(tracking_uri=store).get_model_version_by_alias(NAME, CHAMPION).version) == "1"


# --------------------------------------------------------------------------- 3. DVC's run-cache skips export


def _pipeline_project(root: Path, tok, gate_split: str) -> Path:
    """A project the ``pipeline`` flow accepts (smoke params) whose stages already ran: a model and its
    export bundle (eager, gate BLEU 27.5) are on disk."""
    from support.scratch import resolved_params_yaml

    layout = tiny.project(root, tok)
    (root / "params.yaml").write_text(resolved_params_yaml(SMOKE))
    card = tiny.CARD | {"name": NAME, "scores": {gate_split: {"bleu": 27.5, "chrf": 50.0}}}
    build_bundle(layout.export, model_dir=layout.model, variant=EAGER, variant_dir=None, compute_type=None,
                 decode=OPTIONS, card=card)
    return root


def _up_to_date(monkeypatch) -> None:
    """The flow's steps around ``dvc repro`` as on a project whose stages the run-cache restores: DVC runs
    nothing, no fetch, no push, no host probe."""
    import pipelines.pipeline as pp
    from aiayn.host import HostInfo

    monkeypatch.setattr(pp, "fetch_corpus", lambda layout, mirror: None)
    monkeypatch.setattr(pp, "dvc_cache_data", lambda root: {})
    monkeypatch.setattr(pp, "dvc_repro", lambda root, env: [])
    monkeypatch.setattr(pp, "host_info", lambda: HostInfo("cpu", "vendor", "isa", 1, 0.0))
    monkeypatch.setattr(pp, "matmul_gflops", lambda: 0.0)


def test_an_up_to_date_repro_registers_the_bundle_in_an_empty_store(world, tmp_path, monkeypatch, prefect_harness):
    """The export stage registered the bundle in store A. Pointed at an empty store B, ``dvc repro`` is up to
    date (nothing runs, so nothing registers): the pipeline's registration check registers it in B (once:
    a second run adds nothing), and ``aiayn serve`` finds the champion there."""
    from aiayn.config.schema import load_params
    import pipelines.pipeline as pp

    gate = load_params(SMOKE).quantize.gate_split
    root = _pipeline_project(tmp_path / "project", world["tok"], gate)
    bundle = root / "artifacts" / "export"
    store_a, store_b = _store(tmp_path / "a"), _store(tmp_path / "b")
    with Tracker("export", project_root=root, tracking_uri=store_a, end_pipeline=True) as t:
        assert register_bundle(t, bundle, name=NAME, variant=EAGER, gate_split=gate, bleu=27.5, example=["a man"],
                               provenance={"git_commit": "c0ffee"}) is not None
    _up_to_date(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_b)
    result = pp.pipeline(root=str(root), push=False)
    assert result["ran"] == []
    assert [str(v.version) for v in _versions(store_b)] == ["1"], "nothing was registered in the new store"
    assert result["registration"] == {"status": "registered", "version": "1", "alias": CHAMPION, "why": None}
    assert "- model registry: registered (version 1, champion)" in result["report"]
    assert os.environ.get("MLFLOW_TRACKING_URI") == store_b, "registering must leave the process's store as it was"
    cfg = ServeConfig(model_uri=f"models:/{NAME}@champion", tracking_uri=store_b, log_path=tmp_path / "r.db", poll_s=0)
    served = load_model(cfg, tmp_path / "dl")
    assert served.version == "1" and served.variant == EAGER
    again = pp.pipeline(root=str(root), push=False)  # already registered: nothing new
    assert [str(v.version) for v in _versions(store_b)] == ["1"]
    assert again["registration"]["status"] == "already registered" and again["registration"]["alias"] == CHAMPION


def test_the_bundle_digest_tag_is_the_registry_s():
    from aiayn.export import bundle

    assert bundle.BUNDLE_SHA256_TAG == reg.BUNDLE_SHA256_TAG


def test_a_registration_check_that_cannot_register_fails_the_run_saying_why(world, tmp_path, monkeypatch,
                                                                            prefect_harness):
    from aiayn.config.schema import load_params
    from mlflow.exceptions import MlflowException

    import aiayn.tracking.runs as runs
    import pipelines.pipeline as pp

    gate = load_params(SMOKE).quantize.gate_split
    root = _pipeline_project(tmp_path / "project", world["tok"], gate)
    _up_to_date(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _store(tmp_path / "empty"))

    def refused(*args, **kwargs):
        raise MlflowException("PERMISSION_DENIED: the registry refused the write")

    monkeypatch.setattr(runs, "register_translation", refused)
    state = pp.pipeline(root=str(root), push=False, return_state=True)
    assert state.is_failed(), "the run must fail when the bundle could not be registered"
    assert "not registered" in state.message and "the registry refused the write" in state.message, state.message


# --------------------------------------------------------------------------- 4. a truncated download


@pytest.mark.parametrize("where", ["download", "store"])
def test_a_damaged_bundle_is_refused_never_served(world, tmp_path, monkeypatch, where):
    """``download``: the transfer came back short (mlflow#8104: half the weights file); ``store``: the
    weights in the artifact store were altered, same size (bytes in the middle overwritten: they still
    load). Either way the served model source refuses the version with a message naming the file."""
    import mlflow.artifacts

    store = _store(tmp_path / "store")
    assert _register(store, tmp_path / "p", world["ct2"], 30.0) is not None
    cfg = ServeConfig(model_uri=f"models:/{NAME}@champion", tracking_uri=store, log_path=tmp_path / "r.db", poll_s=0)
    assert load_model(cfg, tmp_path / "ok").version == "1"  # intact: served

    def weights(folder: Path) -> Path:
        (path,) = [p for p in Path(folder).rglob("model.bin") if "bundle" in p.parts]
        return path

    if where == "store":
        path = weights(tmp_path / "store" / "mlruns")
        data = bytearray(path.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
        path.write_bytes(bytes(data))
    else:
        real = mlflow.artifacts.download_artifacts

        def short(*args, **kwargs):
            local = real(*args, **kwargs)
            path = weights(Path(local))
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            return local

        monkeypatch.setattr(mlflow.artifacts, "download_artifacts", short)
    with pytest.raises(RegistryError) as refused:
        load_model(cfg, tmp_path / "bad")
    message = str(refused.value)
    assert "ct2/model.bin" in message and "sha256" in message and NAME in message and "\n" not in message, message
    assert not any((tmp_path / "bad").rglob("model.bin")), "the refused download must not stay on disk"



def test_the_default_store_and_its_lock_files_are_ignored_by_git():
    """What a run leaves beside the project's default MLflow store (the SQLite file, its lock and the registry
    lock, ``aiayn.tracking.registry_lock``) is not shown as untracked by ``git status`` after ``make run``."""
    import subprocess

    from aiayn.tracking import resolve_tracking_uri
    from aiayn.tracking.registry_lock import file_lock_path

    repo = Path(__file__).resolve().parents[1]
    uri = resolve_tracking_uri(repo, None)
    db = Path(uri.removeprefix("sqlite:///"))
    paths = [db, db.with_name(db.name + ".lock"), file_lock_path(uri)]
    for path in paths:
        rel = str(path.relative_to(repo))
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=repo, capture_output=True)
        assert ignored.returncode == 0, f"{rel} is not ignored by .gitignore"
