"""The PTX of every flash-attention kernel for a GPU that is not here, and whether a change kept it.

    python benchmarks/gpu/kernel_ptx.py [--rev REV] [--arch 90] [--out DIR]

Compiles the four kernels of ``aiayn/kernels/flash_kernels.py`` (forward; backward preprocess, dK/dV,
dQ), causal and not, with ``aiayn.kernels.aot`` (bf16, head_dim 128, key_lengths given, each kernel's
default launch config) for ``sm_<arch>`` — no GPU needed. With ``--rev`` it compiles git revision REV's
kernels too (``git archive`` into a scratch folder, run with this checkout's venv and this checkout's
``aot.py``; REV's ``src/`` on ``PYTHONPATH``, which Python searches before this checkout's editable install) and
compares the code of the two: the PTX without its debug section, ``.loc``/``.file`` lines
and comments (``aot.ptx_code``), which a move or reformat of the Python source changes and the machine
code does not. Prints a table (PTX lines, md5 of the code, registers, spill stores, shared memory and,
with ``--rev``, same/DIFF) and the host line; exits 1 when any kernel differs. ``--out`` keeps every PTX.

A change to the kernels' Python that leaves every row "same" is behaviour-neutral on the GPU as well,
checked without one; a row that differs needs ``benchmarks/gpu/run_gpu.sh`` on a GPU. Results: docs/results.md,
"Triton flash attention on GPU".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import REPO, host_line, markdown_row, markdown_table

# aiayn (the kernels) from PYTHONPATH; this checkout's aot.py loaded from its file, so both revisions are compiled
# and compared by the same code.
_WORKER = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("aiayn_aot", sys.argv[1])
aot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(aot)
arch, out = int(sys.argv[2]), sys.argv[3]
rows = []
for name in aot.KERNELS:
    for causal in (True, False):
        k = aot.compile_kernel(name, causal=causal, key_lengths=True, head_dim=128, arch=arch)
        if out:
            with open(f"{out}/{name}_causal{int(causal)}.ptx", "w", encoding="utf-8") as f:
                f.write(k.ptx)
        rows.append(dict(kernel=name, causal=causal, code=aot.ptx_code(k.ptx), shared=k.shared,
                         **aot.ptxas_usage(k.ptx, arch)))
print(json.dumps(rows))
"""


def compile_all(src: Path, arch: int, out: Path | None) -> list[dict]:
    """Every kernel variant of the source tree ``src`` (its ``src/`` on ``PYTHONPATH``), in a fresh process."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(src / "src"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    aot = REPO / "src" / "aiayn" / "kernels" / "aot.py"
    proc = subprocess.run([sys.executable, "-c", _WORKER, str(aot), str(arch), str(out or "")],
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        sys.exit(f"compiling {src} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", help="git revision to compare this checkout's kernels with")
    ap.add_argument("--arch", type=int, default=90, help="NVIDIA compute capability, e.g. 80, 90 (default 90)")
    ap.add_argument("--out", type=Path, help="keep every PTX under OUT/here (and OUT/REV)")
    args = ap.parse_args()
    here = compile_all(REPO, args.arch, args.out / "here" if args.out else None)
    before = None
    if args.rev:
        with tempfile.TemporaryDirectory() as tmp:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.rev], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            before = compile_all(Path(tmp), args.arch, args.out / args.rev if args.out else None)
    print(f"sm_{args.arch}, bf16, head_dim 128, key_lengths; code = PTX without debug info (aot.ptx_code)\n")
    header = ["kernel", "causal", "PTX lines", "md5 of code", "registers", "spill stores", "shared (bytes)"]
    print(markdown_table(header + ([f"vs {args.rev}"] if args.rev else []), [], "llrlrrr" + ("l" if args.rev else "")))
    differ = 0
    for i, r in enumerate(here):
        row = [r["kernel"], r["causal"], len(r["code"].splitlines()), hashlib.md5(r["code"].encode()).hexdigest()[:12],
               max(r["registers"]), max(r["spill_stores"]), r["shared"]]
        if before is not None:
            same = before[i]["kernel"] == r["kernel"] and before[i]["code"] == r["code"]
            differ += not same
            row.append("same" if same else "**DIFF**")
        print(markdown_row(row))
    print(f"\n{host_line()}")
    if before is not None:
        print(f"{len(here) - differ} of {len(here)} kernels compile to the same code as {args.rev}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
