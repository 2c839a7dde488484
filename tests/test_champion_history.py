"""The champion history and rollback (``aiayn.tracking.champion_history``, ``aiayn registry``), each on a
local SQLite MLflow store:

1. registrations and promotions are recorded with their numbers, reason and actor, on the registered model
   (one tag per event) and on the version that took the alias;
2. rollback round trip (API and CLI), ``--to``, rolling back twice, and exit 2 with nothing changed when
   there is no earlier champion;
3. a service polling the alias serves the rolled-back version without a restart;
4. two promotions at once: one consistent champion, two events;
5. a writer killed (SIGKILL) mid-move leaves the old champion or the new one, and the next call repairs
   the history.

Versions whose bundle is never loaded are made directly (``_bare_versions``, no artifacts); the tests that
serve or register use a copy of one store with two real registrations (``registry``, ``own_registry``).
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from support import tiny  # noqa: E402
from support.champion_crash import KILL_AT_ENV  # noqa: E402
from support.scratch import copy_project  # noqa: E402
from aiayn.cli.main import app  # noqa: E402
from aiayn.export.bundle import build_bundle, register_bundle  # noqa: E402
from aiayn.inference.artifacts import EAGER  # noqa: E402
from aiayn.inference.runtimes import DecodeOptions  # noqa: E402
from aiayn.serving.app import create_app  # noqa: E402
from aiayn.serving.config import ServeConfig  # noqa: E402
from aiayn.tracking import CHALLENGER, CHAMPION, RegistryError, Tracker  # noqa: E402
from aiayn.tracking import alias_events, champion_history, registry_lock  # noqa: E402
from aiayn.tracking.champion_history import ChampionHistoryError, history, promote, rollback  # noqa: E402

NAME = "aiayn-en-de"
TESTS = Path(__file__).resolve().parent
OPTIONS = DecodeOptions(beam_size=1, max_len_b=6)
#: Only bounds a hang: the tests wait on states.
HANG_S = 300
ACTOR = "release-bot"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for var in ("AIAYN_PARENT_RUN_ID", "AIAYN_TRACKING", "MLFLOW_TRACKING_URI", "AIAYN_REGISTERED_MODEL",
                "AIAYN_ACTOR", KILL_AT_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def _store(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'mlflow.db').as_posix()}"


def _client(store: str) -> MlflowClient:
    return MlflowClient(tracking_uri=store, registry_uri=store)


def _register(store: str, root: Path, bundle: Path, bleu: float) -> dict:
    """What the export stage does: one stage run that registers ``bundle`` with gate BLEU ``bleu``."""
    with Tracker("export", project_root=root, tracking_uri=store, end_pipeline=True) as t:
        out = register_bundle(t, bundle, name=NAME, variant=EAGER, gate_split="test_a", bleu=bleu,
                              example=["a man"], provenance={"git_commit": "c0ffee"})
    assert out is not None, "registration failed (see the warning)"
    return out


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A store with two real registrations of a tiny eager bundle, by actor ``ACTOR``: v1 (BLEU 30,
    champion), v2 (29, challenger). Never changed: a test that moves an alias takes ``own_registry``."""
    root = tmp_path_factory.mktemp("champion-history")
    tok = tiny.tokenizer(root)
    layout = tiny.project(root / "proj", tok)
    bundle = build_bundle(root / "bundle", model_dir=layout.model, variant=EAGER, variant_dir=None,
                          compute_type=None, decode=OPTIONS, card=tiny.CARD)
    reg = root / "reg"
    store = _store(reg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIAYN_ACTOR", ACTOR)
        for var in ("MLFLOW_TRACKING_URI", "AIAYN_PARENT_RUN_ID", "AIAYN_REGISTERED_MODEL"):
            mp.delenv(var, raising=False)
        v1 = _register(store, reg, bundle, 30.0)
        v2 = _register(store, reg, bundle, 29.0)
    assert (v1["alias"], v2["alias"]) == (CHAMPION, CHALLENGER)
    return {"root": reg, "bundle": bundle}


@pytest.fixture
def own_registry(registry, tmp_path) -> dict:
    root = copy_project(registry["root"], tmp_path / "reg")
    return {**registry, "root": root, "store": _store(root)}


def _bare_versions(store: str, bleus: list[float]) -> MlflowClient:
    """Registered model ``NAME`` with one version per BLEU (tag ``bleu.test_a``), no alias, no history."""
    client = _client(store)
    client.create_registered_model(NAME)
    for bleu in bleus:
        client.create_model_version(NAME, source="file:///nowhere/model", tags={"bleu.test_a": repr(bleu)})
    return client


def _champion(client: MlflowClient) -> str | None:
    version = client.get_registered_model(NAME).aliases.get(CHAMPION)
    return None if version is None else str(version)


def _records(client: MlflowClient) -> dict[str, dict]:
    """The raw event tags of the registered model (``state`` included), by tag key (JSON objects only)."""
    tags = client.get_registered_model(NAME).tags
    return {k: json.loads(v) for k, v in sorted(tags.items())
            if k.startswith(alias_events.HISTORY_TAG_PREFIX) and v.startswith("{")}


def _moves(events: list[dict]) -> list[tuple]:
    return [(e["alias"], e["from_version"], e["to_version"], e["kind"]) for e in events]


# --------------------------------------------------------------------------- 1. what is recorded


def test_registrations_and_promotions_are_recorded_with_their_numbers_and_actor(own_registry, monkeypatch):
    store = own_registry["store"]
    client = _client(store)
    registered = history(client, NAME)
    assert _moves(registered) == [(CHAMPION, None, "1", "register"), (CHALLENGER, None, "2", "register")]
    first, second = registered
    assert first["reason"] == "registered: bleu.test_a 30.00, no champion with a bleu.test_a tag"
    assert second["reason"] == "registered: challenger, bleu.test_a 29.00 < champion 30.00"
    assert [e["metrics"] for e in registered] == [{"bleu.test_a": 30.0}, {"bleu.test_a": 29.0}]
    assert {e["actor"] for e in registered} == {ACTOR}
    assert first["run_id"] == client.get_model_version(NAME, "1").run_id  # the pipeline run of the version
    # a promotion with its own numbers; the actor from AIAYN_ACTOR
    monkeypatch.setenv("AIAYN_ACTOR", "alice@laptop")
    event = promote(client, NAME, "2", tracking_uri=store, reason="human eval: fewer omissions",
                    metrics={"human.adequacy": 4.2}, run_id="r-123")
    assert _champion(client) == "2"
    assert _moves([event]) == [(CHAMPION, "1", "2", "promote")]
    assert (event["actor"], event["metrics"], event["run_id"]) == ("alice@laptop", {"human.adequacy": 4.2}, "r-123")
    assert history(client, NAME) == registered + [event]
    tags = client.get_model_version(NAME, "2").tags
    assert (tags["aiayn.champion_since"], tags["aiayn.champion_reason"], tags["aiayn.champion_actor"],
            tags["aiayn.champion_from_version"], tags["aiayn.champion_event"]) == (
        event["time"], "human eval: fewer omissions", "alice@laptop", "1", "3")
    assert [r["state"] for r in _records(client).values()] == ["done"] * 3
    # no metrics given: the version's scores; no actor anywhere: user@host
    monkeypatch.delenv("AIAYN_ACTOR")
    back = promote(client, NAME, "1", tracking_uri=store, reason="revert")
    assert back["metrics"] == {"bleu.test_a": 30.0}
    assert back["actor"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert promote(client, NAME, "1", tracking_uri=store, reason="again", actor="bob")["actor"] == "bob"


def test_history_tolerates_a_missing_model_an_empty_history_and_a_foreign_tag(tmp_path):
    store = _store(tmp_path / "store")
    client = _client(store)
    assert history(client, NAME) == []  # no registered model
    _bare_versions(store, [30.0])
    assert history(client, NAME) == []  # a model without history
    client.set_registered_model_tag(NAME, alias_events.HISTORY_TAG_PREFIX + "000007", "not json")
    assert history(client, NAME) == []
    assert promote(client, NAME, "1", tracking_uri=store, reason="first")["to_version"] == "1"
    assert "aiayn.history.000008" in _records(client)  # numbered after the largest tag present


def test_bad_promotions_change_nothing(tmp_path):
    store = _store(tmp_path / "store")
    client = _bare_versions(store, [30.0])
    with pytest.raises(ChampionHistoryError, match="version 5 of registered model aiayn-en-de does not exist"):
        promote(client, NAME, "5", tracking_uri=store, reason="typo")
    with pytest.raises(ValueError, match="reason"):
        promote(client, NAME, "1", tracking_uri=store, reason="  ")
    with pytest.raises(ValueError, match="finite"):
        promote(client, NAME, "1", tracking_uri=store, reason="r", metrics={"bleu.test_a": float("nan")})
    assert issubclass(ChampionHistoryError, RegistryError)
    assert _champion(client) is None and history(client, NAME) == [] and _records(client) == {}


# --------------------------------------------------------------------------- 2. rollback


def _cli(*args: str):
    return CliRunner().invoke(app, ["registry", *args])


def test_rollback_round_trip_and_the_cli(tmp_path):
    store = _store(tmp_path / "store")
    client = _bare_versions(store, [30.0, 31.0, 32.0])
    promote(client, NAME, "1", tracking_uri=store, reason="first")
    promote(client, NAME, "2", tracking_uri=store, reason="better")
    event = rollback(client, NAME, tracking_uri=store, actor="oncall")
    assert _champion(client) == "1"
    assert _moves(history(client, NAME)) == [(CHAMPION, None, "1", "promote"), (CHAMPION, "1", "2", "promote"),
                                             (CHAMPION, "2", "1", "rollback")]
    assert (event["reason"], event["actor"], event["metrics"]) == (
        "rollback: champion version 2 -> 1", "oncall", {"bleu.test_a": 30.0})
    # no earlier champion now: exit 2, one line, nothing changed
    before = (_champion(client), _records(client), client.get_model_version(NAME, "1").tags)
    result = _cli("rollback", "--name", NAME, "--tracking-uri", store)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().count("\n") == 0 and "no earlier champion of aiayn-en-de" in result.stderr
    with pytest.raises(ChampionHistoryError, match="no earlier champion"):
        rollback(client, NAME, tracking_uri=store)
    result = _cli("rollback", "--to", "9", "--name", NAME, "--tracking-uri", store)
    assert result.exit_code == 2 and "version 9 of registered model aiayn-en-de does not exist" in result.stderr
    assert (_champion(client), _records(client), client.get_model_version(NAME, "1").tags) == before
    # --to: any existing version
    result = _cli("rollback", "--to", "3", "--name", NAME, "--tracking-uri", store, "--reason", "bad outputs")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "aiayn-en-de: champion version 1 -> 3 (bad outputs)"
    assert _champion(client) == "3"
    # history through the CLI: JSON is the API's list; the plain table one line per event
    result = _cli("history", "--name", NAME, "--tracking-uri", store, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == history(client, NAME)
    table = _cli("history", "--name", NAME, "--tracking-uri", store).stdout.splitlines()
    assert table[0].split("\t") == ["time", "alias", "from -> to", "reason", "metrics", "actor", "run"]
    assert [row.split("\t")[2:5] for row in table[1:]] == [
        ["- -> 1", "first", "bleu.test_a=30"], ["1 -> 2", "better", "bleu.test_a=31"],
        ["2 -> 1", "rollback: champion version 2 -> 1", "bleu.test_a=30"], ["1 -> 3", "bad outputs", "bleu.test_a=32"]]


def test_rolling_back_twice_goes_two_champions_back(tmp_path):
    store = _store(tmp_path / "store")
    client = _bare_versions(store, [30.0, 31.0, 32.0])
    for version in ("1", "2", "3"):
        promote(client, NAME, version, tracking_uri=store, reason=f"v{version}")
    assert rollback(client, NAME, tracking_uri=store)["to_version"] == "2"
    assert rollback(client, NAME, tracking_uri=store)["to_version"] == "1"
    with pytest.raises(ChampionHistoryError, match="no earlier champion"):
        rollback(client, NAME, tracking_uri=store)
    assert _champion(client) == "1" and len(history(client, NAME)) == 5


def test_the_model_name_defaults_to_the_export_stage_s(tmp_path, monkeypatch):
    """No --name: ``aiayn-{src}-{tgt}`` of params.yaml under --root (``AIAYN_REGISTERED_MODEL`` wins); the
    tracking URI: ``MLFLOW_TRACKING_URI`` without ``--tracking-uri``."""
    store = _store(tmp_path / "store")
    client = _bare_versions(store, [30.0])
    promote(client, NAME, "1", tracking_uri=store, reason="first")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "params.yaml").write_text("data:\n  src_lang: en\n  tgt_lang: fr\n")
    result = _cli("history", "--tracking-uri", store, "--root", "proj")
    assert result.exit_code == 0 and result.stdout.strip() == f"aiayn-en-fr: no champion history in {store}"
    monkeypatch.setenv("AIAYN_REGISTERED_MODEL", NAME)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    result = _cli("history", "--json", "--root", "proj")
    assert result.exit_code == 0 and [e["to_version"] for e in json.loads(result.stdout)] == ["1"]
    (tmp_path / "proj" / "params.yaml").write_text("data: [oops\n")
    monkeypatch.delenv("AIAYN_REGISTERED_MODEL")
    result = _cli("history", "--root", "proj")
    assert result.exit_code == 2 and result.stderr.startswith("aiayn registry history: error:"), result.output


# --------------------------------------------------------------------------- 3. the service follows a rollback


class _Server:
    """``create_app(cfg)`` under uvicorn in a thread, on a free loopback port."""

    def __init__(self, cfg: ServeConfig) -> None:
        import uvicorn

        self.url = f"http://127.0.0.1:{cfg.port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(cfg), host="127.0.0.1", port=cfg.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "_Server":
        self.thread.start()
        _until(lambda: self.server.started or not self.thread.is_alive(), "the server started")
        assert self.server.started, "the server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(HANG_S)


def _until(predicate, what: str) -> None:
    """Poll ``predicate`` until it holds; the deadline only bounds a hang."""
    deadline = time.monotonic() + HANG_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not after {HANG_S} s"
        time.sleep(0.05)


def test_a_serving_alias_poller_picks_up_a_rollback_without_a_restart(own_registry, tmp_path):
    store = own_registry["store"]
    client = _client(store)
    promote(client, NAME, "2", tracking_uri=store, reason="canary passed")
    cfg = ServeConfig(model_uri=f"models:/{NAME}@champion", tracking_uri=store, port=tiny.free_port(),
                      log_path=tmp_path / "requests.db", poll_s=0.3)
    with _Server(cfg) as s, httpx.Client(base_url=s.url, timeout=HANG_S) as c:
        assert c.post("/translate", json={"sentences": ["a man"]}).json()["model"]["version"] == "2"
        result = _cli("rollback", "--name", NAME, "--tracking-uri", store)
        assert result.exit_code == 0, result.output
        _until(lambda: c.get("/ready").json()["model"]["version"] == "1", "the rollback picked up")
        assert c.post("/translate", json={"sentences": ["a man"]}).json()["model"]["version"] == "1"
    assert _moves(history(client, NAME))[-2:] == [(CHAMPION, "1", "2", "promote"), (CHAMPION, "2", "1", "rollback")]


# --------------------------------------------------------------------------- 4. two promotions at once


@pytest.mark.parametrize("lock", ["file", "registry"])
def test_two_concurrent_promotions_leave_one_champion_and_two_events(tmp_path, monkeypatch, lock):
    """The first promotion stops after writing its intent until the second has reached the registry lock;
    the second then waits for the first to finish. ``lock="registry"``: the lease a tracking server gets."""
    store = _store(tmp_path / "store")
    client = _bare_versions(store, [30.0, 31.0, 32.0])
    promote(client, NAME, "1", tracking_uri=store, reason="first")
    if lock == "registry":
        monkeypatch.setattr(registry_lock, "file_lock_path", lambda tracking_uri: None)
    real_lock, arrived, first_in = champion_history.model_lock, [], []
    second_arrived = threading.Event()

    def counting_lock(*args, **kwargs):
        arrived.append(threading.current_thread().name)
        if len(arrived) == 2:
            second_arrived.set()
        return real_lock(*args, **kwargs)

    def hold_first(step: str) -> None:
        if step == "intent" and not first_in:
            first_in.append(threading.current_thread().name)
            assert second_arrived.wait(HANG_S), "the second promotion never reached the lock"

    monkeypatch.setattr(champion_history, "model_lock", counting_lock)
    monkeypatch.setattr(alias_events, "step_hook", hold_first)
    errors: list[BaseException] = []

    def run(version: str) -> None:
        try:
            promote(_client(store), NAME, version, tracking_uri=store, reason=f"race {version}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    jobs = [threading.Thread(target=run, args=(v,), name=f"promote-{v}") for v in ("2", "3")]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(HANG_S)
    assert not errors, errors
    events = history(client, NAME)[1:]
    assert len(events) == 2 and {e["to_version"] for e in events} == {"2", "3"}
    assert events[0]["from_version"] == "1" and events[1]["from_version"] == events[0]["to_version"], events
    assert _champion(client) == events[1]["to_version"]
    assert events[0]["reason"] == f"race {events[0]['to_version']}" and first_in == [f"promote-{events[0]['to_version']}"]
    assert [r["state"] for r in _records(client).values()] == ["done"] * 3


# --------------------------------------------------------------------------- 5. killed mid-move


def _killed(args: list[str], step: str, cwd: Path) -> None:
    env = os.environ | {KILL_AT_ENV: step, "PYTHONPATH": os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, "-m", "support.champion_crash", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {step!r} (exit {proc.returncode}): {proc.stderr[-2000:]}"


@pytest.mark.parametrize("writer,step,repairer", [
    ("promote", "intent", "promote"),
    ("promote", "moved", "history"),
    ("register", "intent", "history"),
    ("register", "moved", "rollback"),
])
def test_a_writer_killed_mid_move_leaves_a_champion_and_the_next_call_repairs(own_registry, tmp_path, writer, step,
                                                                             repairer):
    """SIGKILL after the intent is written (the alias not moved: the old champion stays, the intent is
    abandoned) or after the alias moved (the new champion, the event finished by the next call: promote,
    history or rollback). ``register``: the export stage's registration, the version created first."""
    store, root = own_registry["store"], own_registry["root"]
    client = _client(store)
    before = history(client, NAME)
    if writer == "promote":
        _killed(["promote", store, NAME, "2"], step, tmp_path)
        new = "2"
    else:
        _killed(["register", store, str(root), str(own_registry["bundle"]), "31.0"], step, tmp_path)
        new = "3"
        assert client.get_model_version(NAME, "3").tags["bleu.test_a"] == "31.0"  # created before the move
    moved = step == "moved"
    assert _champion(client) == (new if moved else "1"), "the champion must be the old version or the new one"
    last_key, last = list(_records(client).items())[-1]
    assert last["state"] == "intent" and last["to_version"] == new
    # a reader without the lock already answers with the move as it happened
    assert _moves(alias_events.events(client, NAME)) == _moves(before) + (
        [(CHAMPION, "1", new, writer)] if moved else [])
    if repairer == "history":
        history(client, NAME)
    elif repairer == "promote":
        promote(client, NAME, "2", tracking_uri=store, reason="retry")
    else:
        assert rollback(client, NAME, tracking_uri=store)["to_version"] == "1"
    records = _records(client)
    assert records[last_key]["state"] == ("done" if moved else "abandoned")
    assert all(r["state"] != "intent" for r in records.values())
    after = history(client, NAME)
    assert _moves(after[: len(before) + moved]) == _moves(before) + ([(CHAMPION, "1", new, writer)] if moved else [])
    if moved:  # the repair wrote the version tags the killed writer never did
        assert client.get_model_version(NAME, new).tags["aiayn.champion_since"] == after[len(before)]["time"]
    if repairer != "history":  # the repairing call's own event follows, numbered after the killed one's
        assert _moves(after[len(before) + moved:]) == [
            (CHAMPION, "1", "2", "promote") if repairer == "promote" else (CHAMPION, new, "1", "rollback")]
        assert list(records)[-1] > last_key
    assert _champion(client) == {"promote": "2", "rollback": "1", "history": new if moved else "1"}[repairer]
