"""Beam search with vs without the KV cache: same model, same sentences, same run.

Without the cache every step re-runs the decoder over the whole prefix (and
cross-attention keys/values are recomputed); with it each step feeds one token.
The outputs must be identical (checked); the table gives sentences/s, tokens/s
and the speed-up. Needs a trained bundle (``artifacts/model``, from the main
job) and the prepared test set. Results: docs/results.md, "Beam search with and without the KV cache".

    python benchmarks/perf/decode_cache.py [--split test_2016_flickr] [--beam-size 4] [--limit 1000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from aiayn.data.readers import read_lines
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator
from benchmarks.harness import host_line, markdown_table


def run(translator: Translator, sources: list, *, beam_size: int, use_cache: bool, max_tokens: int) -> tuple[float, list]:
    """Seconds and outputs of one pass over ``sources`` (the same batching as ``aiayn translate``)."""
    options = DecodeOptions(beam_size=beam_size, max_tokens=max_tokens, use_cache=use_cache)
    t0 = time.perf_counter()
    out = translator.decoder.translate_ids(sources, options)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=Path("artifacts/model"))
    ap.add_argument("--prepared", type=Path, default=Path("artifacts/prepared"))
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--src-lang", default="en")
    ap.add_argument("--beam-size", type=int, default=4)
    ap.add_argument("--limit", type=int, default=None, help="first N sentences only")
    ap.add_argument("--max-tokens", type=int, default=4000)
    args = ap.parse_args()

    translator = Translator.from_dir(args.model_dir)
    lines = read_lines(args.prepared / f"{args.split}.{args.src_lang}")[: args.limit]
    sources = translator.encode(lines)
    results = {}
    for use_cache in (True, False):
        seconds, hyps = run(translator, sources, beam_size=args.beam_size, use_cache=use_cache, max_tokens=args.max_tokens)
        results[use_cache] = (seconds, hyps)
    same = results[True][1] == results[False][1]
    n_out = sum(len(h) + 1 for h in results[True][1])  # + EOS
    print(f"{args.split}: {len(lines)} sentences, beam {args.beam_size}, model {args.model_dir}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; identical outputs: {same}")
    print(host_line())
    print()
    base = results[False][0]
    print(markdown_table(["decoding", "seconds", "sentences/s", "output tokens/s", "speed-up"],
                         [[label, f"{s:.1f}", f"{len(lines) / s:.1f}", f"{n_out / s:.0f}", f"{base / s:.2f}x"]
                          for label, s in (("full prefix recomputed each step", results[False][0]),
                                           ("KV cache", results[True][0]))]))
    if not same:
        raise SystemExit("cached and uncached beam search disagree")


if __name__ == "__main__":
    main()
