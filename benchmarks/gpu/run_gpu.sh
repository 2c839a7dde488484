#!/usr/bin/env bash
# The one prepared script a GPU task runs for the Triton flash-attention kernel.
#
#   bash benchmarks/gpu/run_gpu.sh        # from anywhere: it runs in the repository root
#
# Installs nothing: needs python3 with torch (CUDA) and triton; pytest, pydantic
# and pyyaml are used when present (steps that need a missing one are skipped
# with a message). PYTHONPATH gets src/ and the repository root (aiayn, benchmarks),
# tests/ too for the stub below. Writes everything under $OUT (default ./gpu-results):
#
#   env.txt                 GPU, driver, torch/triton versions
#   pytest_gpu.txt          the `gpu` tests of tests/test_flash_attention.py (compiled kernels)
#   training_check.log/json benchmarks/gpu/triton_training_check.py, a check (pass/fail), not a benchmark:
#                           tiny model, 300 steps, backend triton vs sdpa (loss curves)
#   train_throughput.md     benchmarks/gpu/gpu_train_throughput.py: base preset, bf16, tokens/s and peak
#                           memory, SDPA vs Triton vs torch.compile
#   smoke_cuda.log          the smoke pipeline's stages on CUDA (when a mirror and the packages exist)
#   attention_bench.md/log  benchmarks/gpu/attention_speed.py table (+ autotuning choices in the log)
#   summary.txt             exit status of every step
#
# Results go to docs/results.md, "Triton flash attention on GPU".
#
# Time: each step has its own limit (120 + 120 + 150 + 120 + 180 s = 11.5 min at most);
# the benchmark rewrites its table after every row, so a time-out still leaves
# the rows measured so far. Order: correctness first, then the training check,
# then the (longest) benchmark.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-./gpu-results}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0          # compiled kernels (tests/conftest.py only sets a default of 1)
export PYTHONDONTWRITEBYTECODE=1
summary="$OUT/summary.txt"
: > "$summary"

step() {  # step NAME TIMEOUT_S COMMAND... ; records the exit status
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s, limit ${limit} s)" | tee -a "$summary"
}

{
  date -u +"%Y-%m-%d %H:%M:%S UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$PYTHON" - <<'EOF'
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print("cuda available:", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Correctness on the GPU: fixed kernel configs (no autotuning) keep compiles few.
if "$PYTHON" -c "import pytest" 2>/dev/null; then
  AIAYN_FLASH_AUTOTUNE=0 step pytest_gpu 120 \
    "$PYTHON" -m pytest -m gpu tests/test_flash_attention.py -q -rA --durations=10 -p no:cacheprovider \
    > "$OUT/pytest_gpu.txt" 2>&1
else
  # No pytest on this machine: run the same gpu test functions with a stub `pytest` module
  # (tests/ on PYTHONPATH: the test module imports as `test_flash_attention`, its helpers as `support`).
  PYTHONPATH="$PWD/tests:$PYTHONPATH" AIAYN_FLASH_AUTOTUNE=0 step pytest_gpu_stub 120 "$PYTHON" - > "$OUT/pytest_gpu.txt" 2>&1 <<'EOF'
import sys, types, traceback
class _Mark:
    def __getattr__(self, name):
        if name in ("parametrize", "skipif"):
            return lambda *a, **k: (lambda f: f)
        return lambda f: f  # bare markers such as @pytest.mark.gpu
stub = types.ModuleType("pytest"); stub.mark = _Mark(); sys.modules["pytest"] = stub
import test_flash_attention as t
failed = 0
calls = [(f"matches_reference{c}", lambda c=c: t._check_against_reference(*c, "cuda")) for c in t.GPU_CASES]
calls += [(f"bf16_vs_sdpa causal={c}", lambda c=c: t.test_gpu_bf16_error_no_worse_than_torch_sdpa(c))
          for c in (False, True)]
for name, fn in calls:
    try:
        fn(); print("PASSED", name, flush=True)
    except Exception:
        failed += 1; print("FAILED", name); traceback.print_exc()
print(f"{len(calls) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
fi
tail -n 25 "$OUT/pytest_gpu.txt"

# 2. Training check (pass/fail): tiny model, triton vs sdpa loss curves (fixed configs: it is about numerics).
if "$PYTHON" -c "import pydantic, yaml" 2>/dev/null; then
  AIAYN_FLASH_AUTOTUNE=0 step training_check 120 \
    "$PYTHON" benchmarks/gpu/triton_training_check.py --steps 300 --amp bf16 --out "$OUT/training_check.json" \
    > "$OUT/training_check.log" 2>&1
  tail -n 12 "$OUT/training_check.log"
else
  echo "training_check: skipped (pydantic/pyyaml not installed; aiayn.config.schema needs them)" | tee -a "$summary"
fi

# 3. Training throughput and memory, base preset, bf16: SDPA vs Triton vs torch.compile.
if "$PYTHON" -c "import pydantic, yaml, numpy" 2>/dev/null; then
  step train_throughput 150 \
    "$PYTHON" benchmarks/gpu/gpu_train_throughput.py --steps 30 --warmup 10 --rounds 1 --out "$OUT/train_throughput.json" \
    > "$OUT/train_throughput.md" 2> "$OUT/train_throughput.log"
  cat "$OUT/train_throughput.md"
else
  echo "train_throughput: skipped (pydantic/pyyaml/numpy not installed)" | tee -a "$summary"
fi

# 4. The smoke pipeline on CUDA (fetch from a local mirror -> evaluate), when its packages and a mirror exist.
MIRROR="${AIAYN_DATA_MIRROR:-$PWD/../shared/data/multi30k}"
if "$PYTHON" -c "import sentencepiece, sacrebleu, typer, safetensors" 2>/dev/null && [ -f "$MIRROR/SHA256SUMS" ]; then
  SMOKE="$OUT/smoke"; mkdir -p "$SMOKE"
  sed 's/^  max_steps: .*/  max_steps: 150\n  device: cuda/' configs/smoke.yaml > "$SMOKE/params.yaml"
  cat > "$SMOKE/run.sh" <<EOF2
set -e
export AIAYN_TRACKING=off
"$PYTHON" -m aiayn.cli.main fetch --mirror "$MIRROR" --root "$SMOKE"
for s in prepare tokenize train evaluate; do
  "$PYTHON" -m aiayn.cli.main "\$s" --params "$SMOKE/params.yaml" --root "$SMOKE"
done
EOF2
  step smoke_cuda 120 bash "$SMOKE/run.sh" > "$OUT/smoke_cuda.log" 2>&1
  tail -n 5 "$OUT/smoke_cuda.log"; cat "$SMOKE/artifacts/eval_metrics.json" 2>/dev/null
else
  echo "smoke_cuda: skipped (needs sentencepiece, sacrebleu, typer, safetensors and a Multi30k mirror at $MIRROR)" | tee -a "$summary"
fi

# 5. Benchmark: autotuned kernels vs SDPA flash/efficient; head_dim 128 first (the row that matters most).
TRITON_PRINT_AUTOTUNING=1 step attention_bench 180 \
  "$PYTHON" benchmarks/gpu/attention_speed.py --head-dims 128,64 --rep-ms 40 --out "$OUT/attention_bench.md" \
  > "$OUT/attention_bench.log" 2>&1
grep '^|' "$OUT/attention_bench.log" | tail -n 30

echo "---- summary"
cat "$summary"
