"""Settings of ``aiayn serve``: one frozen dataclass, its fields the CLI's flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_MODEL_URI", "ServeConfig"]

DEFAULT_MODEL_URI = "models:/aiayn-en-de@champion"


@dataclass(frozen=True)
class ServeConfig:
    """Service settings (CLI flags of ``aiayn serve``). Units: seconds, milliseconds, bytes, days."""

    bundle: Path | None = None  # a serving bundle folder; else model_uri
    model_uri: str = DEFAULT_MODEL_URI  # models:/NAME@ALIAS (polled) or models:/NAME/VERSION
    tracking_uri: str | None = None  # registry; default MLFLOW_TRACKING_URI, else sqlite:///mlflow.db
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch_sentences: int = 32  # units per micro-batch
    max_wait_ms: float = 5.0  # how long a batch waits for more requests once opened
    workers: int = 1  # batches decoding at once (CTranslate2 bundles: workers of one thread each)
    threads: int = 1  # CTranslate2 inter_threads per worker / torch threads for an eager bundle
    max_sentences: int = 64  # per request
    max_body_bytes: int = 256 * 1024
    max_request_tokens: int = 2048  # source tokens (with EOS) per request: bounds one request's decode time
    max_beam_size: int = 8
    long_policy: str = "split"
    poll_s: float = 30.0  # registry alias polling interval (0: never)
    log_path: Path = Path("serving") / "requests.db"  # SQLite request log, unless log_url
    log_url: str | None = None  # postgresql://... : one log for several replicas
    retention_days: float = 30.0
    prune_every_s: float | None = None  # None: retention_days / 10, within 1 s .. 1 h
    busy_timeout_ms: int = 10_000
    body_timeout_s: float = 10.0  # the whole request body must arrive within this (else 408)
    drain_s: float = 30.0  # graceful shutdown: requests in flight get this long to finish
    scores: bool = True  # a score per translation in every answer (costs one teacher-forced pass: module doc)
    output_reference: Path | None = None  # thresholds of /metrics' flagged answers (aiayn.serving.output_flags)
    output_signals: bool = True  # each answer's output signals, logged and counted; off: the answer alone is logged

    @property
    def log_target(self) -> str | Path:
        """Where the request log is: ``log_url`` when set, else ``log_path``."""
        return self.log_url or self.log_path

    @property
    def prune_interval_s(self) -> float:
        if self.prune_every_s is not None:
            return self.prune_every_s
        return min(3600.0, max(1.0, self.retention_days * 86400 / 10))
