"""Where the eager beam-search decoder spends its time, next to ct2-float32 on the same sentences.

    python benchmarks/perf/decode_profile.py [--model-dir artifacts/model] [--ct2 artifacts/quantized/ct2-float32]
                                        [--sentences 128] [--batch 32] [--threads 1]

Decodes the first ``--sentences`` lines of test_2016_flickr (beam 4, the evaluate stage's options)
in batches of ``--batch``: eager under ``torch.profiler`` (CPU), then the same with no profiler and
CTranslate2 float32 (alternating, 3 rounds, medians). Prints the eager/ct2 time ratio and the top
operators by self CPU time, grouped into: attention/linear matmuls, softmax/log-softmax, layer norm,
beam bookkeeping (topk, gather, index, cat), and the rest. Results: docs/results.md, "Eager beam search against
CTranslate2".
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.harness import REPO, Spread, alternate, host_line, markdown_table, ratios

GROUPS = {
    "matmul (linear, attention)": ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear",
                                   "aten::_scaled_dot_product", "aten::baddbmm"),
    "softmax / log_softmax": ("aten::_softmax", "aten::_log_softmax", "aten::softmax", "aten::log_softmax"),
    "layer norm": ("aten::native_layer_norm", "aten::layer_norm"),
    "beam bookkeeping (topk, gather, index, cat, copy)": ("aten::topk", "aten::gather", "aten::index", "aten::cat",
                                                          "aten::index_select", "aten::copy_", "aten::where",
                                                          "aten::masked_fill", "aten::sort", "aten::argsort"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=REPO / "artifacts" / "model")
    ap.add_argument("--ct2", type=Path, default=REPO / "artifacts" / "quantized" / "ct2-float32")
    ap.add_argument("--source", type=Path, default=REPO / "artifacts" / "prepared" / "test_2016_flickr.en")
    ap.add_argument("--sentences", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from aiayn.inference.runtimes import CT2Decoder, DecodeOptions
    from aiayn.inference.translator import Translator

    torch.set_num_threads(args.threads)
    tr = Translator.from_dir(args.model_dir, device="cpu")
    lines = args.source.read_text(encoding="utf-8").splitlines()[: args.sentences]
    srcs = tr.encode(lines)
    opts = DecodeOptions(beam_size=4, len_penalty=0.6, max_len_a=1.0, max_len_b=50)
    ct = CT2Decoder(args.ct2, tr.tokenizer, max_side_tokens=tr.max_side_tokens, compute_type="float32",
                    intra_threads=args.threads)

    def eager() -> float:
        t0 = time.perf_counter()
        tr.decoder.translate_ids(srcs, opts, batch_size=args.batch)
        return time.perf_counter() - t0

    def ctr() -> float:
        t0 = time.perf_counter()
        ct.translate_ids(srcs, opts, batch_size=args.batch)
        return time.perf_counter() - t0

    eager(), ctr()  # warm-up
    times = alternate({"eager": eager, "ct2": ctr}, args.rounds)
    eager_vs_ct2 = Spread.of(ratios(times["eager"], times["ct2"]))

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = eager()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    grouped = {g: 0.0 for g in GROUPS} | {"other": 0.0}
    for e in events:
        g = next((g for g, names in GROUPS.items() if e.key.startswith(names)), "other")
        grouped[g] += e.self_cpu_time_total

    print(f"{len(srcs)} sentences of {args.source.name}, beam 4, batch {args.batch}, {args.threads} thread(s), "
          f"torch {torch.__version__}\n{host_line()}\n")
    print(markdown_table(["decoder", f"seconds (median of {args.rounds}, min-max)"],
                         [[k, f"{Spread.of(v):.2f}"] for k, v in times.items()], "lr"))
    print(f"\neager / ct2-float32 time: {eager_vs_ct2.median:.2f}x (min {eager_vs_ct2.low:.2f}, "
          f"max {eager_vs_ct2.high:.2f})\n")
    print(f"Eager under the profiler: {wall:.2f} s wall; self CPU time by operator group:\n")
    print(markdown_table(["group", "share of self CPU time"],
                         [[g, f"{100 * t / total:.1f} %"] for g, t in sorted(grouped.items(), key=lambda kv: -kv[1])],
                         "lr"))
    print("\nTop 12 operators by self CPU time:\n")
    print(markdown_table(["operator", "calls", "self CPU ms", "share"],
                         [[f"`{e.key}`", e.count, f"{e.self_cpu_time_total / 1000:.0f}",
                           f"{100 * e.self_cpu_time_total / total:.1f} %"]
                          for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]], "lrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
