"""The beam's length penalty swept per split: sacreBLEU BLEU and the output/reference length ratio of each finished
model at each ``len_penalty`` (alpha), to choose alpha on val as the paper did (Sec. 6.1) and to see whether the
test sets agree with that choice.

Each ``--run NAME=DIR`` is a finished project (``DIR/artifacts/model``, ``DIR/artifacts/prepared``). Decoding is the
evaluate stage's (``aiayn.stages.evaluate.decode_split``: beam ``--beam``, ``max_len_a`` 1.0, ``max_len_b`` 50,
``--norm`` gnmt ``((5+|Y|)/6)^alpha`` or fairseq ``|Y|^alpha``), on ``--threads`` threads; BLEU is sacreBLEU 13a.

    python benchmarks/studies/len_penalty.py --split val --alphas 1.0 1.4 1.8 2.2 \\
        --run main=../nu3 --run rope=../g3

Prints a Markdown table (BLEU, length ratio) and the host line. Nothing here is a timing but the seconds per decode.
Results: docs/studies/decoding.md (and the recipe studies that choose alpha on val).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import sacrebleu
import torch

from aiayn.config.schema import EvalConfig
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from aiayn.stages.evaluate import decode_split
from benchmarks.harness import host_line, markdown_table


def sweep(root: Path, split: str, alphas: list[float], beam: int, norm: str, src: str, tgt: str) -> list[str]:
    """One table row: ``"BLEU (ratio)"`` per alpha for the model and split of project ``root``."""
    translator = Translator.from_dir(root / "artifacts" / "model", device="cpu")
    prepared = root / "artifacts" / "prepared"
    sources, references = read_lines(prepared / f"{split}.{src}"), read_lines(prepared / f"{split}.{tgt}")
    cells = []
    for alpha in alphas:
        t0 = time.perf_counter()
        options = DecodeOptions.from_eval(EvalConfig(beam_size=beam, len_penalty=alpha, length_norm=norm))
        hyps = decode_split(translator, sources, options, "error")
        bleu = sacrebleu.corpus_bleu(hyps, [references])
        cells.append(f"{bleu.score:.2f} ({bleu.sys_len / bleu.ref_len:.3f})")
        print(f"  {root.name} {split} alpha {alpha}: {cells[-1]} [{time.perf_counter() - t0:.0f} s]", flush=True)
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="val")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.6, 1.0, 1.4, 1.8, 2.2])
    ap.add_argument("--run", action="append", required=True, help="NAME=DIR of a finished project")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--norm", choices=["gnmt", "fairseq"], default="gnmt")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(host_line())
    rows = [(name, sweep(Path(path), args.split, args.alphas, args.beam, args.norm, args.src, args.tgt))
            for name, path in (r.split("=", 1) for r in args.run)]
    print(f"\n{args.split}, beam {args.beam}, {args.norm}: BLEU (output/reference length)\n")
    print(markdown_table(["model", *(f"alpha {a}" for a in args.alphas)], [[name, *cells] for name, cells in rows]))


if __name__ == "__main__":
    main()
