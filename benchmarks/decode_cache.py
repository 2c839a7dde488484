"""Beam search with vs without the KV cache: same model, same sentences, same run.

Without the cache every step re-runs the decoder over the whole prefix (and
cross-attention keys/values are recomputed); with it each step feeds one token.
The outputs must be identical (checked); the table gives sentences/s, tokens/s
and the speed-up. Needs a trained bundle (``artifacts/model``, from the main
job) and the prepared test set.

    python benchmarks/decode_cache.py [--split test_2016_flickr] [--beam-size 4] [--limit 1000]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from aiayn.config import PAD_ID
from aiayn.corpus import read_lines
from aiayn.decode import beam_search
from aiayn.translate import Translator


def run(translator: Translator, sources: list, *, beam_size: int, use_cache: bool, max_tokens: int) -> tuple[float, list]:
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list = [None] * len(sources)
    t0 = time.perf_counter()
    start = 0
    with torch.inference_mode():
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(sources[order[end]]) <= max_tokens:
                end += 1
            idx = order[start:end]
            src = torch.full((len(idx), max(len(sources[i]) for i in idx)), PAD_ID, dtype=torch.long)
            for r, i in enumerate(idx):
                src[r, : len(sources[i])] = torch.from_numpy(sources[i])
            for i, h in zip(idx, beam_search(translator.model, src, beam_size=beam_size, use_cache=use_cache)):
                out[i] = h
            start = end
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
          f"{torch.get_num_threads()} threads, {platform.machine()}; identical outputs: {same}")
    print()
    print("| decoding | seconds | sentences/s | output tokens/s | speed-up |")
    print("|---|---|---|---|---|")
    base = results[False][0]
    for use_cache, label in ((False, "full prefix recomputed each step"), (True, "KV cache")):
        s = results[use_cache][0]
        print(f"| {label} | {s:.1f} | {len(lines) / s:.1f} | {n_out / s:.0f} | {base / s:.2f}x |")
    if not same:
        raise SystemExit("cached and uncached beam search disagree")


if __name__ == "__main__":
    main()
