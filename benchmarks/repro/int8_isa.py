"""CTranslate2 int8 of a trained model under each int8 arithmetic an x86 host may run, side by side.

    python benchmarks/repro/int8_isa.py --model-dir artifacts/model --prepared artifacts/prepared \
        [--params params.yaml] [--splits test_2016_flickr ...]

CTranslate2's int8 GEMM sums u8 x s8 products exactly on CPUs with VNNI (and in MKL's generic path),
but oneDNN on an x86 CPU WITHOUT VNNI (AVX2, e.g. AMD Zen 2/3) adds pairs of products into
saturating int16 (``aiayn.quantize.int8``). Every row is decoded in a fresh subprocess whose
environment selects the arithmetic, so one host measures them all:

- ``float32``:                  ct2-float32 (the reference of every delta)
- ``int8 (this host)``:         ct2-int8 as this host runs it
- ``int8 saturating (AVX2)``:   ``CT2_USE_MKL=0 ONEDNN_MAX_CPU_ISA=AVX2``: what an AVX2-only AMD host computes
- ``int8 exact (MKL)``:         ``CT2_USE_MKL=1``: exact int32 sums on any x86 CPU

Decoding uses the evaluate stage's options (``--params``); one worker, one thread. Prints a table of
BLEU per split, the delta to float32 and decode seconds, and the host line. Results: docs/results.md, "int8 and
the CPU", and docs/studies/int8-and-vnni.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import host_line, markdown_table

ROWS = {
    "float32": ("float32", {}),
    "int8 (this host)": ("int8", {}),
    "int8 saturating (AVX2)": ("int8", {"CT2_USE_MKL": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
    "int8 exact (MKL)": ("int8", {"CT2_USE_MKL": "1"}),
}

_DECODE = r"""
import json, sys, time
from aiayn.config.schema import EOS_ID, load_params
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import CT2Decoder, DecodeOptions
from aiayn.quantize.int8 import int8_accumulation
from aiayn.evaluation.scoring import score
from aiayn.tokenizer import Tokenizer
import numpy as np
ct2_dir, compute_type, params_path, prepared, splits = sys.argv[1:6]
p = load_params(params_path)
e = p.evaluate
opts = DecodeOptions.from_eval(e)
tok = Tokenizer.load(f"{ct2_dir}/spm.model")
max_side = json.loads(open(f"{ct2_dir}/max_side_tokens.json").read())
tr = CT2Decoder(ct2_dir, tok, max_side_tokens=max_side, compute_type=compute_type)
out = {"host": int8_accumulation(), "splits": {}}
for split in splits.split(","):
    src = read_lines(f"{prepared}/{split}.{p.data.src_lang}")
    ref = read_lines(f"{prepared}/{split}.{p.data.tgt_lang}")
    ids = [np.asarray(x + [EOS_ID], dtype=np.int64) for x in tok.encode(src)]
    t0 = time.perf_counter()
    hyps = tr.translate_ids(ids, opts)
    seconds = time.perf_counter() - t0
    out["splits"][split] = {"bleu": float(score(tok.decode(hyps), ref)["bleu"]), "seconds": seconds}
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default="artifacts/model")
    ap.add_argument("--prepared", default="artifacts/prepared")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--splits", nargs="+", default=["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"])
    args = ap.parse_args(argv)

    import shutil

    import torch

    from aiayn.inference.artifacts import ModelBundle
    from aiayn.export.ctranslate2 import AiaynConverter

    torch.set_num_threads(1)
    bundle = ModelBundle.load(Path(args.model_dir), device="cpu")
    model, tokenizer = bundle.model, bundle.tokenizer
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("float32", "int8"):
            out = Path(tmp) / quantization
            AiaynConverter(model, tokenizer).convert(str(out), quantization=quantization, force=True)
            shutil.copyfile(Path(args.model_dir) / "spm.model", out / "spm.model")
            (out / "max_side_tokens.json").write_text(json.dumps(model.max_side_tokens))
        for row, (quantization, extra) in ROWS.items():
            env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
            proc = subprocess.run([sys.executable, "-c", _DECODE, str(Path(tmp) / quantization), quantization,
                                   args.params, args.prepared, ",".join(args.splits)],
                                  env=env, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{row}: decoding failed:\n{proc.stderr[-3000:]}")
            results[row] = json.loads(proc.stdout.strip().splitlines()[-1])

    base = results["float32"]["splits"]
    table = []
    for row, r in results.items():
        cells = [f"{r['splits'][s]['bleu']:.2f} ({r['splits'][s]['bleu'] - base[s]['bleu']:+.2f})" for s in args.splits]
        sums = "float" if row == "float32" else f"{r['host']['accumulation']} ({r['host']['why']})"
        table.append([row, sums, *cells, f"{sum(r['splits'][s]['seconds'] for s in args.splits):.1f}"])
    print(markdown_table(["arithmetic", "sums (as this host)", *(f"{s} BLEU (delta)" for s in args.splits), "decode s"],
                         table, "ll" + "r" * (len(args.splits) + 1)))
    print(host_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
