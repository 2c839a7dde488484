"""The registry lock: one registration of a model at a time creates its version, reads the champion,
decides and moves the alias (``aiayn.tracking.registry.register_translation``; mlflow#22635: two exports
that both read the champion before either writes leave the worse one as champion).

Two kinds, chosen by the store:

- a SQLite store (``sqlite:///<path>``): an exclusive ``flock`` on ``<db>.registry.lock`` beside the
  database (every thread and process of the host; the kernel drops it when its holder dies);
- any other store (an MLflow tracking server, PostgreSQL): a lease kept in the registry itself.
  Creating the registered model ``<name>.aiayn-lock`` is the test-and-set (the store's unique model
  name: one creator succeeds, the others get ``RESOURCE_ALREADY_EXISTS`` and wait), and its holder
  deletes it. While held it is listed among the registered models. A lease older than
  ``LEASE_TTL_S`` (a holder that died) is broken by the next waiter.

Either way a waiter gives up after ``wait_s`` with ``RegistryLockTimeout`` (``WAIT_S`` by default).
Whoever moves an alias without the lock (a person in the UI, another tool) is caught afterwards:
``register_translation`` re-reads the alias it set and decides again when it moved.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["RegistryLockTimeout", "model_lock"]

#: The lease's registered model is ``<name><LOCK_MODEL_SUFFIX>``.
LOCK_MODEL_SUFFIX = ".aiayn-lock"
#: Seconds after which a lease counts as abandoned (a registration holds it for seconds).
LEASE_TTL_S = 300.0
#: Seconds a registration waits for the lock.
WAIT_S = 120.0
_OWNER_TAG = "aiayn.lock_owner"
_POLL_S = 0.2


class RegistryLockTimeout(RuntimeError):
    """The registry lock of a model stayed held for longer than the wait."""


def file_lock_path(tracking_uri: str) -> Path | None:
    """``<db>.registry.lock`` for a ``sqlite:///`` store on a file, else None (the store gets the lease)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    if db in ("", ":memory:"):
        return None
    db_path = Path(db)
    return db_path.with_name(db_path.name + ".registry.lock")


@contextlib.contextmanager
def model_lock(client: Any, name: str, tracking_uri: str, *, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold model ``name``'s registry lock in the block (the kind the store gets: module doc).

    Raises ``RegistryLockTimeout`` after ``wait_s`` seconds of waiting; MLflow's errors propagate."""
    path = file_lock_path(tracking_uri)
    lock = _file_lock(path, wait_s) if path is not None else _lease(client, name + LOCK_MODEL_SUFFIX, wait_s)
    with lock:
        yield


@contextlib.contextmanager
def _file_lock(path: Path, wait_s: float) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    with open(path, "a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RegistryLockTimeout(f"registry lock {path} still held after {wait_s:g} s") from None
                time.sleep(_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _lease(client: Any, lock: str, wait_s: float) -> Iterator[None]:
    from mlflow.exceptions import MlflowException

    token, deadline = uuid.uuid4().hex, time.monotonic() + wait_s
    while True:
        try:
            client.create_registered_model(lock, tags={_OWNER_TAG: token},
                                           description="aiayn registry lock: held while a version is registered")
            break
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        age_s = _lease_age_s(client, lock)
        if age_s is not None and age_s > LEASE_TTL_S:
            _delete(client, lock)  # abandoned by a holder that died
            continue
        if time.monotonic() > deadline:
            raise RegistryLockTimeout(f"registry lock {lock!r} still held after {wait_s:g} s (held {age_s or 0:.0f} s; "
                                      f"one older than {LEASE_TTL_S:g} s is broken)")
        time.sleep(_POLL_S)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            if (client.get_registered_model(lock).tags or {}).get(_OWNER_TAG) == token:
                _delete(client, lock)


def _lease_age_s(client: Any, lock: str) -> float | None:
    """Seconds since the lease was taken; None when it is gone (released meanwhile)."""
    from mlflow.exceptions import MlflowException

    try:
        held = client.get_registered_model(lock)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return time.time() - (held.creation_timestamp or 0) / 1000


def _delete(client: Any, lock: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.delete_registered_model(lock)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
