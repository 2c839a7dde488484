"""Minimum Bayes risk (MBR) selection over the beam's n-best: does choosing the consensus translation, rather than
the beam's top hypothesis, raise BLEU on the Multi30k test sets when the choice of utility is made on val?

For each ``--run NAME=DIR`` (a finished project: ``DIR/artifacts/model``, ``DIR/artifacts/prepared``) and each
``--split``, the evaluate stage's decoder (``aiayn.inference.translator.Translator``, beam ``--beam``, ``len_penalty``
``--alpha``, GNMT normalisation, ``max_len_a`` 1.0, ``max_len_b`` 50) writes the ``--beam``-best list of every
sentence. Then, for each utility (sentence BLEU with effective order, chrF, their mean) and each candidate count
``K`` in ``--k``, every sentence's output is

    argmax_h  sum_r  w(r) * utility(h, r)      over the K best hypotheses h, r (Kumar & Byrne 2004, Eq. 3)

with ``w`` uniform (``temp 0``) or the softmax of the beam's length-normalised scores (``temp 1``), and
``utility(h, h) = 100``. The row ``top1`` is the beam's own choice. Scores: sacreBLEU BLEU (13a) and chrF.

    python benchmarks/mbr.py --split val test_2016_flickr --beam 8 --k 4 8 --run run20=../run20

Prints one Markdown table per run and the host line. Timings are seconds per decode, 1 thread; nothing else is timed.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import sacrebleu
import torch
from sacrebleu.metrics import BLEU, CHRF

from aiayn.config.schema import EvalConfig
from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import DecodeOptions
from aiayn.host import host_info
from aiayn.inference.translator import Translator

UTILITIES = ("bleu", "chrf", "mean")


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


def utilities(texts: list[str]) -> dict[str, list[list[float]]]:
    """Per utility (``UTILITIES``), the matrix ``u[i][j] = utility(texts[i], texts[j])`` (``texts[j]`` the
    pseudo-reference; 100 where the two are the same text). Each sentence score is computed once."""
    bleu, chrf = BLEU(effective_order=True), CHRF()
    same = [[h == r for r in texts] for h in texts]
    b = [[100.0 if same[i][j] else bleu.sentence_score(h, [r]).score for j, r in enumerate(texts)]
         for i, h in enumerate(texts)]
    c = [[100.0 if same[i][j] else chrf.sentence_score(h, [r]).score for j, r in enumerate(texts)]
         for i, h in enumerate(texts)]
    return {"bleu": b, "chrf": c, "mean": [[(x + y) / 2 for x, y in zip(rb, rc)] for rb, rc in zip(b, c)]}


def choose(scores: list[float], u: list[list[float]], temp: float) -> int:
    """Index of the hypothesis with the highest expected utility ``sum_r w(r) u[h][r]`` over the first
    ``len(scores)`` hypotheses, ``w`` uniform (``temp`` 0) or the softmax of ``scores / temp``."""
    top = max(scores)
    weights = [math.exp((s - top) / temp) if temp else 1.0 for s in scores]
    k = len(scores)
    expected = [sum(w * u[h][r] for r, w in enumerate(weights)) for h in range(k)]
    return max(range(k), key=expected.__getitem__)


def mbr_choice(cands: list[tuple[str, float]], utility: str, temp: float) -> str:
    """The hypothesis of ``cands`` (``(text, score)``) with the highest expected ``utility`` against the others
    (module docstring)."""
    texts = [t for t, _ in cands]
    return texts[choose([s for _, s in cands], utilities(texts)[utility], temp)]


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
    print(host_info().line())
    for name, path in (r.split("=", 1) for r in args.run):
        root = Path(path)
        table = {s: rows(nbest(root, s, args.beam, args.alpha, args.src),
                         read_lines(root / "artifacts" / "prepared" / f"{s}.{args.tgt}"), args.k) for s in args.split}
        print(f"\n{name}: BLEU / chrF, beam {args.beam}, alpha {args.alpha}\n")
        print("| choice | " + " | ".join(args.split) + " |")
        print("|---|" + "---|" * len(args.split))
        for key in table[args.split[0]]:
            print(f"| {key} | " + " | ".join(table[s][key] for s in args.split) + " |")


if __name__ == "__main__":
    main()
