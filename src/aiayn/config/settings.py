"""The environment an aiayn process reads, and the defaults it sets where it starts.

Every ``AIAYN_*`` variable the product reads is named here once (the ``*_ENV`` constants) and parsed
by ``Settings.from_env`` into one frozen object; code that needs one reads that object, never
``os.environ``. ``from_env`` is cheap and caches nothing: each operation (a stage's recorder, a
fetch, a flow's push) reads the environment once when it starts, so a variable a flow exports for
its stage processes, or a test sets, is seen by the next operation. Switches only the tests read
(``AIAYN_TEST_STRICT``, ``AIAYN_TEST_DISTRIBUTED``) are the tests' own (tests/support), not settings.

Two ``AIAYN_*`` variables are not read by any Python code and have no field:
``AIAYN_S3_ACCESS_KEY_ID`` and ``AIAYN_S3_SECRET_ACCESS_KEY`` (``.env`` / ``docker-compose.yml``:
the MinIO service account that MLflow and the Prefect worker use).

Importing ``aiayn`` changes nothing in the environment. ``apply_process_defaults`` sets the process
defaults (``PROCESS_ENV_DEFAULTS`` and, on a CPU with AVX2, ``CPU_CAPABILITY_DEFAULT``; in the fp32
stages on an Intel CPU, ``FP32_STAGE_DEFAULT``; a value the user set wins); the entry points call it
before anything loads torch: ``aiayn`` (``aiayn.cli.main.main``, ``python -m aiayn``) and the ``pipelines``
mains and flow modules. Only the processes that run one stage know it, and only they set
``FP32_STAGE_DEFAULT``: ``aiayn <stage>``, ``python -m pipelines.run_stage <stage>`` (every ``dvc.yaml`` cmd)
and a distributed rank (``python -m aiayn.stages.train_worker``). A flow run in a process of its own
choosing (a Prefect worker running ``pipelines.flows.train`` in-process, the ``drift`` flow's check)
keeps MKL's own kernels; the drift check's embeddings are compared statistically, so that is harmless.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Settings",
    "apply_process_defaults",
    "PROCESS_ENV_DEFAULTS",
    "CPU_CAPABILITY_DEFAULT",
    "FP32_STAGE_DEFAULT",
    "FP32_STAGES",
    "TRACKING_ENV",
    "PARENT_RUN_ENV",
    "REGISTERED_MODEL_ENV",
    "MIRROR_ENV",
    "SERVE_THREADS_ENV",
    "FLASH_AUTOTUNE_ENV",
    "STAGE_ERROR_FILE_ENV",
    "PIPELINE_RUN_ENV",
    "DVC_REMOTE_ENV",
    "REQUEST_LOG_URL_ENV",
    "FAULT_POINT_ENV",
    "ACTOR_ENV",
]

#: ``0``/``false``/``off``/``no`` (any case): MLflow tracking off, every recorder call a no-op.
TRACKING_ENV = "AIAYN_TRACKING"
#: MLflow run id of the pipeline (parent) run a stage's run nests under; set by the ``pipeline``
#: flow for the stage processes ``dvc repro`` starts (the flow owns that run and ends it).
PARENT_RUN_ENV = "AIAYN_PARENT_RUN_ID"
#: Name of the model the export stage registers in the MLflow Model Registry; unset, the name comes
#: from the language pair (``aiayn.config.schema.registered_model_name``: ``aiayn-{src_lang}-{tgt_lang}``).
REGISTERED_MODEL_ENV = "AIAYN_REGISTERED_MODEL"
#: A local folder holding the Multi30k files (``fetch`` copies from it instead of downloading).
MIRROR_ENV = "AIAYN_DATA_MIRROR"
#: CTranslate2 workers (one thread each) / torch threads of the registered pyfunc model.
SERVE_THREADS_ENV = "AIAYN_SERVE_THREADS"
#: ``0``: the Triton flash-attention kernel uses the first config of each list (no autotuning).
FLASH_AUTOTUNE_ENV = "AIAYN_FLASH_AUTOTUNE"
#: File ``python -m pipelines.run_stage`` writes a failing stage's message to (set by ``pipeline``).
STAGE_ERROR_FILE_ENV = "AIAYN_STAGE_ERROR_FILE"
#: Prefect flow run id of the enclosing ``pipeline`` run; stage flow runs are tagged with it.
PIPELINE_RUN_ENV = "AIAYN_PIPELINE_RUN_ID"
#: Name of the DVC remote the ``pipeline`` flow pushes to (``.dvc/config``); unset: the default.
DVC_REMOTE_ENV = "AIAYN_DVC_REMOTE"
#: The serving request log as a PostgreSQL URL (``postgresql://USER:PASSWORD@HOST:PORT/DB``), read by
#: ``aiayn serve`` (unless ``--log-url``) and the drift monitor (unless ``--log-url``/``--input``):
#: replicas share one log. Unset: the SQLite file (``--log-path`` / ``monitor.log_path``).
REQUEST_LOG_URL_ENV = "AIAYN_REQUEST_LOG_URL"
#: The fault campaign's kill point (``aiayn.faults``): the process that reaches the point of this name
#: kills itself with SIGKILL. Unset (always, outside tests/test_fault_campaign.py): every point is inert.
FAULT_POINT_ENV = "AIAYN_FAULT_POINT"
#: Who moves a registry alias, as the champion history records it (``aiayn.tracking.champion_history``);
#: unset: ``<user>@<host>``.
ACTOR_ENV = "AIAYN_ACTOR"

#: Set where an aiayn process starts, unless already set. ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP
#: workers sleep instead of spinning; on a 2-core machine with one or two other busy processes,
#: 2-thread training keeps ~0.56-0.62 of its idle speed instead of ~0.37-0.38, idle it costs ~5 %
#: (docs/studies/thread-oversubscription.md, ``benchmarks/perf/contention.py``). Speed only, never results;
#: no effect once torch has loaded its OpenMP runtime.
PROCESS_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
#: Set too where the CPU has AVX2 and FMA (every x86 host this project has seen): PyTorch's
#: vectorised CPU kernels (softmax, layer norm, elementwise ops, reductions) take their AVX2 versions
#: on AVX-512 hosts as well, where PyTorch would pick AVX-512 and sum in another order. With MKL's
#: fp32 GEMM, which takes one code path on AMD hosts with and without AVX-512 (measured), a run gives
#: the same bytes on both (docs/studies/same-bytes-per-host-class.md). Results,
#: not only speed. Never set where the CPU lacks AVX2 (PyTorch would run instructions it has not);
#: ``ATEN_CPU_CAPABILITY=avx512`` (or ``default``) set by the user wins. ``OPENBLAS_CORETYPE=Haswell``
#: does the same for numpy's and scipy's OpenBLAS (the drift reference's PCA): it picks its kernels by
#: CPU model: Haswell's on the other AMD hosts seen, SkylakeX's on a Zen 4 (family 25, model 17), which gave a
#: drift reference with other bytes from the same inputs (docs/studies/same-bytes-per-host-class.md). Read
#: when numpy loads.
CPU_CAPABILITY_DEFAULT = {"ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell"}
#: Set too in the processes of ``FP32_STAGES`` where the CPU is Intel's with AVX2 and FMA: Intel's MKL
#: picks its fp32 GEMM kernels by CPUID, so an AVX-512 Xeon and an AVX2-only Intel CPU trained other bytes
#: (AMD hosts: one MKL path whatever the setting, measured; not set there). ``MKL_CBWR=AVX2`` makes an
#: Intel host compute what MKL computes on an AVX2-only one (Intel's "Conditional Numerical
#: Reproducibility"). Results, and speed: 0.845x the main job's step on an AVX-512 Xeon
#: (docs/studies/same-bytes-per-host-class.md). Not process-wide: capped at AVX2, MKL's int8 GEMM,
#: which CTranslate2 uses, loses VNNI and sums int8 products the int16-saturating way, so the quantize
#: stage, serving and ``aiayn translate`` keep MKL's own choice. A value the user set (``MKL_CBWR=AUTO``:
#: MKL's choice) wins.
FP32_STAGE_DEFAULT = {"MKL_CBWR": "AVX2"}
#: The stages whose outputs are the model's fp32 arithmetic (the weights, the test-set translations and
#: scores, the drift reference's embeddings): ``python -m pipelines.run_stage <name>`` and ``aiayn <name>``.
#: (``aiayn monitor`` is not one: it writes no pipeline output, and the drift flow runs it in-process.)
FP32_STAGES = frozenset({"train", "evaluate", "monitor_reference", "monitor-reference"})


def apply_process_defaults(isa: tuple[str, ...] | None = None, *, stage: str | None = None,
                           vendor: str | None = None) -> None:
    """Set ``PROCESS_ENV_DEFAULTS``, and ``CPU_CAPABILITY_DEFAULT`` when ``isa`` (default: this host's
    flags, ``aiayn.host``) has ``avx2`` and ``fma``, in ``os.environ`` (a value already set wins); and
    ``FP32_STAGE_DEFAULT`` too when ``stage`` (the stage or command the process runs) is one of
    ``FP32_STAGES`` and ``vendor`` (default: this host's) is ``GenuineIntel``.
    Call it before the process runs its first PyTorch CPU op: PyTorch and MKL fix their kernels then.

    Also ``TORCHINDUCTOR_CACHE_DIR`` (unless set): Inductor's default folder with one subfolder per
    ``ATEN_CPU_CAPABILITY`` value (``aten-avx2``, ``aten-native`` when unset). Inductor's cache reuses
    kernels compiled for another capability's vector width (torch 2.13: a ``train.compile`` run
    after one under the other capability computed NaN and wrong sums), so each gets its own."""
    from aiayn.host import host_info

    host = host_info(probe=False) if isa is None or vendor is None else None
    isa = host.isa if isa is None else isa
    vendor = host.vendor if vendor is None else vendor
    defaults = dict(PROCESS_ENV_DEFAULTS)
    if {"avx2", "fma"} <= set(isa):
        defaults |= CPU_CAPABILITY_DEFAULT
        if stage in FP32_STAGES and vendor == "GenuineIntel":
            defaults |= FP32_STAGE_DEFAULT
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    capability = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_inductor_default_dir(), f"aten-{capability}"))


def _inductor_default_dir() -> str:
    """Inductor's own default cache folder (``torch._inductor.runtime.cache_dir_utils.default_cache_dir``),
    computed without importing torch: ``<tmp>/torchinductor_<user>``."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def _optional(environ: Mapping[str, str], name: str) -> str | None:
    """The value, or None when unset or empty."""
    return environ.get(name) or None


@dataclass(frozen=True)
class Settings:
    """The ``AIAYN_*`` environment, parsed (each field names its variable)."""

    #: ``TRACKING_ENV``: MLflow tracking on (default) or off.
    tracking: bool = True
    #: ``PARENT_RUN_ENV``: the pipeline run to nest under, when an orchestrator made one.
    parent_run_id: str | None = None
    #: ``REGISTERED_MODEL_ENV`` as given, None when unset: replaces the name the export stage derives
    #: from the language pair (``aiayn.config.schema.registered_model_name``).
    registered_model_override: str | None = None
    #: ``MIRROR_ENV``: the local corpus folder, when set.
    data_mirror: Path | None = None
    #: ``SERVE_THREADS_ENV``: threads of the registered pyfunc model.
    serve_threads: int = 1
    #: ``FLASH_AUTOTUNE_ENV``: autotune the Triton flash-attention kernel.
    flash_autotune: bool = True
    #: ``STAGE_ERROR_FILE_ENV``: where a failing stage writes its message, when set.
    stage_error_file: Path | None = None
    #: ``PIPELINE_RUN_ENV``: the enclosing ``pipeline`` flow run, when set.
    pipeline_run_id: str | None = None
    #: ``DVC_REMOTE_ENV``: the DVC remote to push to, when set.
    dvc_remote: str | None = None
    #: ``REQUEST_LOG_URL_ENV``: the shared request log, when set (holds a password: never log it).
    request_log_url: str | None = None
    #: ``FAULT_POINT_ENV``: the kill point armed in this process (tests only), None when unset.
    fault_point: str | None = None
    #: ``ACTOR_ENV``: who the champion history says moved an alias, when set.
    actor: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Parse ``environ`` (default ``os.environ``). An empty value counts as unset, except for
        ``AIAYN_REGISTERED_MODEL`` (taken as given).

        Raises:
            ValueError: ``AIAYN_SERVE_THREADS`` is not an integer (the message names the variable and
                quotes the value).
        """
        env = os.environ if environ is None else environ
        mirror, error_file = _optional(env, MIRROR_ENV), _optional(env, STAGE_ERROR_FILE_ENV)
        return cls(
            tracking=env.get(TRACKING_ENV, "1").strip().lower() not in {"0", "false", "off", "no"},
            parent_run_id=_optional(env, PARENT_RUN_ENV),
            registered_model_override=env.get(REGISTERED_MODEL_ENV),
            data_mirror=Path(mirror) if mirror else None,
            serve_threads=_number(env, SERVE_THREADS_ENV, "1", int),
            flash_autotune=env.get(FLASH_AUTOTUNE_ENV, "1") != "0",
            stage_error_file=Path(error_file) if error_file else None,
            pipeline_run_id=_optional(env, PIPELINE_RUN_ENV),
            dvc_remote=_optional(env, DVC_REMOTE_ENV),
            request_log_url=_optional(env, REQUEST_LOG_URL_ENV),
            fault_point=_optional(env, FAULT_POINT_ENV),
            actor=_optional(env, ACTOR_ENV),
        )


def _number(environ: Mapping[str, str], name: str, default: str, kind: type) -> int | float:
    value = environ.get(name, default)
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}") from None
