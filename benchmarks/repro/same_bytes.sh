#!/usr/bin/env bash
# Does a change keep the pipeline's bytes? ("behaviour unchanged, bit for bit")
#
#   benchmarks/repro/same_bytes.sh REV OUT      # e.g. 3412d51 /tmp/sb-before; then HEAD /tmp/sb-head
#
# Runs `dvc repro quantize` in a scratch project built from git revision REV (exported with `git archive`,
# run with this checkout's .venv) on the main job's params.yaml of that revision with a budget any host
# finishes in minutes: 200 updates, warmup 100, checkpoints every 50, the average of the last 2, no clock;
# quantize cut to ct2-float32 + ct2-int8 without the throughput and attribution side measurements.
# A revision that knows `train.select` gets `guard: warn` (the old rule: the average is the model).
# One torch thread, so two revisions can run side by side. Writes OUT/hashes.txt (sha256 of every
# prepared, tokenized, model, eval and quantized file), OUT/dvc.lock and OUT/log.txt; compare two OUTs
# with `diff`. Needs AIAYN_DATA_MIRROR (or internet) for the Multi30k fetch. ~12 min on 2 cores.
# REV's code is imported through PYTHONPATH (its src/, its root, its tests/ for the scratch project), which Python
# searches before this checkout's editable install. Results: docs/studies/same-bytes-per-host-class.md.
set -euo pipefail
rev=$1 out=$(realpath -m "$2")
repo=$(cd "$(dirname "$0")/../.." && pwd)
py=$repo/.venv/bin/python
rm -rf "$out" && mkdir -p "$out/src"
git -C "$repo" archive "$rev" | tar -x -C "$out/src"
export PYTHONPATH=$out/src/src:$out/src:$out/src/tests OMP_NUM_THREADS=1 AIAYN_TRACKING=0 PATH=$repo/.venv/bin:$PATH
cd "$out/src"
"$py" - "$out" <<'PYEOF'
import sys
from pathlib import Path

import yaml

out = Path(sys.argv[1])
p = yaml.safe_load(open("params.yaml"))
p["train"] |= {"max_steps": 200, "max_time_s": None, "warmup_steps": 100, "checkpoint_every": 50,
               "validate_every": 100, "keep_checkpoints": 5, "average_last": 2, "log_every": 50}
if "class SelectConfig" in Path("src/aiayn/config/schema.py").read_text():
    p["train"]["select"] = {"guard": "warn"}
p["quantize"] |= {"variants": ["ct2-float32", "ct2-int8"], "serving_preference": ["ct2-int8", "ct2-float32"],
                  "throughput": False, "layer_attribution": False}
yaml.safe_dump(p, open(out / "params.yaml", "w"), sort_keys=False)
try:
    from support.scratch import scratch_project  # tests/support/scratch.py (PYTHONPATH has tests/)
except ImportError:
    from pipelines.scratch import scratch_project  # a revision from before it moved into tests/support
scratch_project(out / "project", out / "params.yaml", source=".")
PYEOF
cd "$out/project"
{ "$py" -m aiayn.cli.main fetch ${AIAYN_DATA_MIRROR:+--mirror "$AIAYN_DATA_MIRROR"} && dvc repro quantize; } > "$out/log.txt" 2>&1
find artifacts/prepared artifacts/tokenized artifacts/model artifacts/eval artifacts/quantized -type f -print0 |
  sort -z | xargs -0 sha256sum > "$out/hashes.txt"
cp dvc.lock "$out/dvc.lock"
echo "$rev: $(wc -l < "$out/hashes.txt") files hashed in $out/hashes.txt"
