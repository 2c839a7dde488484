"""Processes whose environment changes where they start, never on import, and the CPU kernels those
defaults pick: the same bytes on AVX2 and AVX-512 hosts of one vendor (ATEN_CPU_CAPABILITY, MKL_CBWR),
eager or compiled, in the train stage and in a rank started by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.strict import host_class_skip

REPO = Path(__file__).resolve().parents[1]


ENV_AFTER = """
import json, os, sys
before = dict(os.environ)
for module in sys.argv[1:]:
    __import__(module)
after = dict(os.environ)
print(json.dumps({k: [before.get(k), after.get(k)] for k in set(before) | set(after) if before.get(k) != after.get(k)}))
"""


def _bare_env() -> dict[str, str]:
    import os

    keep = ("PATH", "HOME", "LANG", "TMPDIR", "PREFECT_HOME", "TRITON_INTERPRET")
    return {k: os.environ[k] for k in keep if k in os.environ}


def test_importing_the_packages_leaves_the_environment_alone():
    modules = ["aiayn", "aiayn.cli.main", "aiayn.stages", "aiayn.tracking", "aiayn.recording", "pipelines",
               "pipelines.dag", "pipelines.run_stage", "monitoring", "monitoring.monitor_commands"]
    out = subprocess.run([sys.executable, "-c", ENV_AFTER, *modules], cwd=REPO, env=_bare_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {}


def test_the_entry_points_set_the_process_defaults():
    """``aiayn`` (``aiayn.cli.main.main``) sets OMP_WAIT_POLICY before torch loads; ``pipelines.run_stage``
    also sets Prefect's and DVC's defaults; a value the user set wins."""
    code = ("import os, sys\n"
            "from aiayn.cli.main import main\n"
            "sys.argv = ['aiayn', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_bare_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["PASSIVE", "False"]
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_bare_env() | {"OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-2:] == ["ACTIVE", "False"]

    code = ("import os\nfrom pipelines import run_stage as stage\n"
            "try:\n    stage.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('DVC_NO_ANALYTICS'),"
            " os.environ.get('PREFECT_SERVER_ANALYTICS_ENABLED'))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_bare_env(), capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["PASSIVE", "1", "false"]


def test_the_cpu_kernels_are_avx2_wherever_the_cpu_has_avx2():
    """``ATEN_CPU_CAPABILITY=avx2`` where the CPU has AVX2 and FMA, so a stage sums in the same order on
    AVX2 and AVX-512 hosts and gives the same bytes (docs/studies/same-bytes-per-host-class.md); never set
    without AVX2 (PyTorch would run instructions the CPU lacks); the user's value wins. A stage process on
    this host runs PyTorch's AVX2 kernels (left alone, PyTorch runs its AVX-512 ones on an AVX-512 host)."""
    import os
    from unittest import mock

    from aiayn.host import host_info
    from aiayn.config.settings import apply_process_defaults

    for isa, expected in ((("avx2", "fma", "avx512f"), "avx2"), (("avx2", "fma"), "avx2"), (("avx2",), None),
                          ((), None)):
        with mock.patch.dict(os.environ, {}, clear=True):
            apply_process_defaults(isa)
            assert os.environ.get("ATEN_CPU_CAPABILITY") == expected, isa
            assert os.environ.get("OPENBLAS_CORETYPE") == (expected and "Haswell"), isa
            assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    with mock.patch.dict(os.environ, {"ATEN_CPU_CAPABILITY": "avx512"}, clear=True):
        apply_process_defaults(("avx2", "fma", "avx512f"))
        assert os.environ["ATEN_CPU_CAPABILITY"] == "avx512"
        assert os.path.basename(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == "aten-avx512"
    with mock.patch.dict(os.environ, {}, clear=True):  # one Inductor cache per kernel set (see the next test)
        apply_process_defaults(())
        assert os.path.basename(os.environ["TORCHINDUCTOR_CACHE_DIR"]) == "aten-native"
    with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": "/srv/cache"}, clear=True):
        apply_process_defaults(("avx2", "fma"))
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/srv/cache"

    if not {"avx2", "fma"} <= set(host_info(probe=False).isa):
        host_class_skip("this CPU has no AVX2: PyTorch picks its own kernels here")
    code = ("from pipelines import run_stage as stage\n"
            "try:\n    stage.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "import torch\nprint(torch.backends.cpu.get_cpu_capability())\n"
            "import numpy, scipy.linalg\nfrom threadpoolctl import threadpool_info\n"
            "print(sorted({i['architecture'] for i in threadpool_info() if i['internal_api'] == 'openblas'}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_bare_env(), capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2] == "AVX2"
    assert out.stdout.splitlines()[-1] == "['Haswell']"  # numpy's and scipy's OpenBLAS: the drift reference's PCA


def test_mkl_is_held_to_avx2_in_the_fp32_stages_of_an_intel_cpu():
    """``MKL_CBWR=AVX2`` where the CPU is Intel's with AVX2 and FMA and the process runs a stage whose outputs are
    fp32 model arithmetic (train, evaluate, the drift reference): Intel's MKL picks its GEMM kernels by CPUID, so
    an AVX-512 Xeon trained other bytes than an AVX2-only Intel CPU. Never in quantize, serving or a process
    without a stage (capped at AVX2, CTranslate2's int8 GEMM loses VNNI), never on AMD (one MKL path there,
    measured) or without AVX2; the user's value wins. Both entry points read the stage from the command line."""
    import os
    from unittest import mock

    from aiayn.cli import main as cli
    from aiayn.config import settings
    from aiayn.config.settings import apply_process_defaults
    from pipelines import run_stage as stage_main

    avx512 = ("avx2", "fma", "avx512f")
    for isa, vendor, stage, expected in (
            (avx512, "GenuineIntel", "train", "AVX2"), (("avx2", "fma"), "GenuineIntel", "evaluate", "AVX2"),
            (avx512, "GenuineIntel", "monitor_reference", "AVX2"), (avx512, "GenuineIntel", "monitor-reference", "AVX2"),
            (avx512, "GenuineIntel", "quantize", None), (avx512, "GenuineIntel", "serve", None),
            (avx512, "GenuineIntel", "translate", None), (avx512, "GenuineIntel", None, None),
            (avx512, "AuthenticAMD", "train", None), (("avx2",), "GenuineIntel", "train", None),
            ((), "GenuineIntel", "train", None)):
        with mock.patch.dict(os.environ, {}, clear=True):
            apply_process_defaults(isa, stage=stage, vendor=vendor)
            assert os.environ.get("MKL_CBWR") == expected, (isa, vendor, stage)
    with mock.patch.dict(os.environ, {"MKL_CBWR": "AUTO"}, clear=True):
        apply_process_defaults(avx512, stage="train", vendor="GenuineIntel")
        assert os.environ["MKL_CBWR"] == "AUTO"

    assert stage_main._stage_name(["train"]) == "train"
    assert stage_main._stage_name(["--params", "p.yaml", "evaluate", "--root", "x"]) == "evaluate"
    assert stage_main._stage_name(["--root", "train", "quantize"]) == "quantize"
    assert stage_main._stage_name([]) is None
    assert stage_main._stage_name(["train", "--params"]) is None  # the real parser reports it
    for argv, expected in ((["aiayn", "evaluate", "--help"], "evaluate"), (["aiayn", "--help"], None),
                           (["aiayn", "monitor-reference", "--help"], "monitor-reference")):
        seen = []
        with mock.patch.object(sys, "argv", argv), \
                mock.patch.object(settings, "apply_process_defaults", lambda **kw: seen.append(kw["stage"])), \
                pytest.raises(SystemExit):
            cli.main()
        assert seen == [expected]


_GEMM_BYTES = r"""
import hashlib, os, sys
if sys.argv[1] != "bare":
    from pipelines import run_stage as stage
    try:
        stage.main([sys.argv[1], "--help"])
    except SystemExit:
        pass
import torch
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
a, b = torch.randn(333, 517, generator=g), torch.randn(517, 259, generator=g)
print(os.environ.get("MKL_CBWR"), hashlib.sha256((a @ b).numpy().tobytes()).hexdigest())
"""


def test_the_train_stage_computes_the_gemm_bytes_of_an_avx2_only_cpu():
    """A train stage process (``python -m pipelines.run_stage train``) on this host computes an fp32 GEMM's bytes as
    MKL computes them on a CPU with AVX2 and nothing wider (``MKL_ENABLE_INSTRUCTIONS=AVX2``, what an AVX2-only
    Intel CPU runs); a quantize stage process leaves MKL its own choice. Left to MKL's own choice, an AVX-512
    Xeon gives other bytes (MKL's AVX-512 kernels; docs/studies/same-bytes-per-host-class.md)."""
    from aiayn.host import host_info

    host = host_info(probe=False)
    if not {"avx2", "fma"} <= set(host.isa):
        host_class_skip("this CPU has no AVX2")

    def gemm(mode: str, **env: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _GEMM_BYTES, mode], cwd=REPO, env=_bare_env() | env,
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[-2:]

    intel = host.vendor == "GenuineIntel"
    train, quantize = gemm("train"), gemm("quantize")
    assert train[0] == ("AVX2" if intel else "None") and quantize[0] == "None"
    avx2_only, own = gemm("bare", MKL_ENABLE_INSTRUCTIONS="AVX2")[1], gemm("bare")[1]
    assert train[1] == avx2_only and quantize[1] == own
    if intel and "avx512f" in host.isa:  # the case the setting is for: MKL's own kernels sum otherwise here
        assert own != avx2_only


_COMPILED_EQUALS_EAGER = r"""
import torch
from aiayn.config.settings import apply_process_defaults
apply_process_defaults()
torch.manual_seed(0)
x, norm = torch.randn(8, 37, 32), torch.nn.LayerNorm(32)
def f(x):
    y = norm(x)
    return torch.softmax(y @ y.transpose(1, 2) / 5.0, -1).sum(), torch.relu(y).mean()
eager, compiled = f(x), torch.compile(f, dynamic=True)(x)
print(torch.backends.cpu.get_cpu_capability(), all(torch.allclose(a, b, rtol=1e-5) for a, b in zip(eager, compiled)))
"""


@pytest.mark.slow
@pytest.mark.timeout(1300)  # two torch.compile processes, one after the other, each bounded by its own 600 s
def test_a_compiled_run_after_one_under_other_cpu_kernels_computes_the_same(tmp_path):
    """torch 2.13's Inductor cache reuses kernels compiled for another ``ATEN_CPU_CAPABILITY``'s vector
    width: a ``train.compile`` run on an AVX-512 host after one with the other kernels computed wrong sums
    and NaN (CI, after the avx2 default; fresh caches gave the right values). ``apply_process_defaults``
    gives each capability its own cache folder. Two processes share one temporary folder (TMPDIR): the
    first runs AVX-512 kernels, the second the default."""
    from aiayn.host import host_info

    if "avx512f" not in host_info(probe=False).isa:
        host_class_skip("needs an AVX-512 host: two kernel sets to switch between")
    env = _bare_env() | {"TMPDIR": str(tmp_path)}
    lines = []
    for extra in ({"ATEN_CPU_CAPABILITY": "avx512"}, {}):
        out = subprocess.run([sys.executable, "-c", _COMPILED_EQUALS_EAGER], cwd=REPO, env=env | extra,
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        lines.append(out.stdout.split()[-2:])
    assert lines == [["AVX512", "True"], ["AVX2", "True"]]


def test_python_m_aiayn_lists_the_monitor_commands():
    out = subprocess.run([sys.executable, "-m", "aiayn", "--help"], cwd=REPO, env=_bare_env() | {"COLUMNS": "200"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    commands = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("│ ") and len(line.split()) > 1]
    for name in ("prepare", "train", "export", "monitor-reference", "monitor", "fetch", "translate", "serve"):
        assert name in commands, (name, out.stdout)





_RANK_ENV = r"""
import os, runpy, sys
sys.argv = ["train_worker"]  # no ROOT/JOB_DIR: usage, exit 2, after the module's start-up
try:
    runpy.run_module("aiayn.stages.train_worker", run_name="__main__")
except SystemExit:
    pass
print(os.environ.get("MKL_CBWR"), os.environ.get("ATEN_CPU_CAPABILITY"))
"""


def test_a_rank_started_by_hand_computes_as_the_train_stage_and_a_launched_one_as_its_launcher():
    """``python -m aiayn.stages.train_worker`` (what each node runs for a multi-node job) applies the train stage's
    process defaults before torch loads; a value it is given wins, which is how the one-node launcher makes its
    ranks sum as it does (it passes its MKL setting on, ``AUTO`` when unset; tests/test_distributed.py's
    comparisons of ranks with one process pass either way, within their tolerance)."""
    from aiayn.host import host_info

    host = host_info(probe=False)

    def rank_env(**env: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _RANK_ENV], cwd=REPO, env=_bare_env() | env, capture_output=True,
                             text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[-2:]

    avx2 = {"avx2", "fma"} <= set(host.isa)
    intel_avx2 = avx2 and host.vendor == "GenuineIntel"
    assert rank_env() == ["AVX2" if intel_avx2 else "None", "avx2" if avx2 else "None"]
    assert rank_env(MKL_CBWR="AUTO")[0] == "AUTO"  # what the launcher passes when it runs MKL's own kernels

    import os
    from unittest import mock

    from aiayn.stages.train import _rank_env

    for here, passed in (({}, "AUTO"), ({"MKL_CBWR": ""}, "AUTO"), ({"MKL_CBWR": "AVX2"}, "AVX2")):
        with mock.patch.dict(os.environ, here | {"PATH": "/bin"}, clear=True):
            assert _rank_env() == {"PATH": "/bin", "MKL_CBWR": passed}
