"""Minimum Bayes risk (MBR) selection over the beam's n-best: does choosing the consensus translation, rather than
the beam's top hypothesis, raise BLEU on the Multi30k test sets when the choice of utility is made on val?

For each ``--run NAME=DIR`` (a finished project: ``DIR/artifacts/model``, ``DIR/artifacts/prepared``) and each
``--split``, the evaluate stage's decoder (``aiayn.inference.translator.Translator``, beam ``--beam``, ``len_penalty``
``--alpha``, GNMT normalisation, ``max_len_a`` 1.0, ``max_len_b`` 50) writes the ``--beam``-best list of every
sentence. Then, for each utility (sentence BLEU with effective order, chrF, their mean) and each candidate count
``K`` in ``--k``, every sentence's output is

    argmax_h  sum_r  w(r) * utility(h, r)      over the K best hypotheses h, r (Kumar & Byrne 2004, Eq. 3)

with ``w`` uniform (``temp 0``) or the softmax of the beam's length-normalised scores (``temp 1``), and
``utility(h, h) = 100`` (``aiayn.inference.mbr``). The row ``top1`` is the beam's own choice. Scores: sacreBLEU
BLEU (13a) and chrF. Results: docs/studies/decoding.md.

    python benchmarks/studies/mbr_study.py --split val test_2016_flickr --beam 8 --k 4 8 --run run20=../run20

Prints one Markdown table per run and the host line. Timings are seconds per decode, 1 thread; nothing else is timed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import sacrebleu
import torch

from aiayn.config.schema import EvalConfig
from aiayn.data.readers import read_lines
from aiayn.inference.mbr import UTILITIES, choose, utilities
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from benchmarks.harness import host_line, markdown_table


def nbest(root: Path, split: str, beam: int, alpha: float, src: str) -> list[list[tuple[str, float]]]:
    """The ``beam``-best ``(text, length-normalised score)`` list of every sentence of ``split``, best first."""
    translator = Translator.from_dir(root / "artifacts" / "model", device="cpu")
    options = DecodeOptions.from_eval(EvalConfig(beam_size=beam, len_penalty=alpha, length_norm="gnmt"))
    t0 = time.perf_counter()
    prepared = translator.prepare(read_lines(root / "artifacts" / "prepared" / f"{split}.{src}"), options)
    out = [[(line.text, line.score) for line in lines]
           for chunk in translator.translate_prepared_nbest(prepared, options, n_best=beam) for lines in chunk]
    print(f"  {root.name} {split}: {beam}-best of {len(out)} sentences in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def rows(lists: list[list[tuple[str, float]]], refs: list[str], ks: list[int]) -> dict[str, str]:
    """``"BLEU / chrF"`` of the beam's top hypothesis and of every (K, utility, temp) MBR choice. The utility
    matrices of each sentence's n-best are computed once; K takes their top-left K x K block."""
    def cell(hyps: list[str]) -> str:
        return f"{sacrebleu.corpus_bleu(hyps, [refs]).score:.2f} / {sacrebleu.corpus_chrf(hyps, [refs]).score:.2f}"

    matrices = [utilities([t for t, _ in c[:max(ks)]]) for c in lists]
    out = {"top1": cell([c[0][0] for c in lists])}
    for k in ks:
        for utility in UTILITIES:
            for temp in (0.0, 1.0):
                out[f"K {k}, {utility}, temp {temp:g}"] = cell(
                    [c[choose([s for _, s in c[:k]], m[utility], temp)][0] for c, m in zip(lists, matrices)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, help="NAME=DIR of a finished project")
    ap.add_argument("--split", nargs="+", default=["val", "test_2016_flickr"])
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(host_line())
    for name, path in (r.split("=", 1) for r in args.run):
        root = Path(path)
        table = {s: rows(nbest(root, s, args.beam, args.alpha, args.src),
                         read_lines(root / "artifacts" / "prepared" / f"{s}.{args.tgt}"), args.k) for s in args.split}
        print(f"\n{name}: BLEU / chrF, beam {args.beam}, alpha {args.alpha}\n")
        print(markdown_table(["choice", *args.split],
                             [[key, *(table[s][key] for s in args.split)] for key in table[args.split[0]]]))


if __name__ == "__main__":
    main()
