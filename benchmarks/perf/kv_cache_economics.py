"""KV-cache economics: the cache's bytes per token for each preset and variant, CPU decoding at
batch 1 x long input vs batch 32 x short input, and a computed GPU bound for the big preset.

    python benchmarks/perf/kv_cache_economics.py [--quick] [--rounds 7] [--threads 1]

Three tables (docs/results.md, "KV-cache economics"):

1. **Bytes per token** for every preset (tiny, base, big) and variant (the paper's MHA; GQA with
   ``n_kv_heads = n_heads / 4``, or 2 where that would be 1 (tiny); MQA ``n_kv_heads = 1``;
   ``positions`` rope and alibi with MHA: ``aiayn.model.kv_economics.cache_variants``), in float32 and
   bfloat16: the formula
   ``aiayn.model.kv_cache.cache_bytes_per_token`` (``2 * n_kv_heads * head_dim * bytes``: keys +
   values of one token in one decoder layer) against the bytes MEASURED from a real ``KVCache``
   filled by the model's own ``encode``/``decode`` (``kv_economics.measured_bytes_per_token``) (tiny: a real CPU model; base/big: the same code
   on the 'meta' device, which gives the real shapes and dtypes without allocating memory):
   self-attention ``self_nbytes / (batch * max_len * n_layers)`` and cross-attention
   ``cross_nbytes / (batch * src_len * n_layers)`` (per SOURCE token, stored once per source).
   The script stops with an error if formula and measurement differ.
2. **CPU decoding** with a randomly initialised ``tiny`` model (seed 0, vocabulary 8000): the
   cached greedy loop (``Transformer.encode`` once, then ``decode`` one token a step with the KV
   cache, argmax with PAD/BOS/EOS/UNK forbidden so exactly the requested number of tokens is
   generated), timed from ``encode`` to the last token, at batch 1 x 100 source tokens x 100
   generated and batch 32 x 16 x 16. Generated tokens/s = batch x generated / seconds; rounds
   alternate over shapes and variants (median and min-max); the cache memory is ``KVCache.nbytes``
   (self buffers at capacity, cross keys/values, the bool source mask), checked against the formula.
3. **Computed, not measured**: the big preset in bf16 on a GPU, batch 1 x 1024 source + 1024
   generated tokens and batch 32 x 64 + 64: cache bytes, and the memory-bandwidth lower bound of
   one decode step at the full cache, ``(weights read per step + cache bytes) / bandwidth`` with
   an ASSUMED 4.8e12 B/s (H200 HBM3e peak). Weights read per step (``kv_economics.decoder_step_weight_bytes``):
   the decoder (without the
   cross-attention K/V projections, whose outputs are cached) and the tied output projection, at
   the paper's 37000-token vocabulary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time

import torch

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig, model_preset
from aiayn.model import Transformer
from aiayn.model.kv_cache import cache_bytes, cache_bytes_per_token
from aiayn.model.kv_economics import cache_variants, decoder_step_weight_bytes, measured_bytes_per_token
from benchmarks.harness import Spread, host_line, markdown_table

PRESETS = ("tiny", "base", "big")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GPU_BANDWIDTH = 4.8e12  # B/s, ASSUMED: NVIDIA H200 HBM3e peak bandwidth (data sheet)
GPU_SHAPES = ((1, 1024), (32, 64))  # (batch, tokens): source tokens = generated tokens = tokens
PAPER_VOCAB = 37000  # paper Sec. 5.1, shared BPE vocabulary


def config(preset: str, overrides: dict, **extra) -> ModelConfig:
    return model_preset(preset, attention_backend="sdpa", **overrides, **extra)


def bytes_table() -> str:
    """Table 1: formula against measurement, every preset, variant and dtype (stops when they differ)."""
    rows = []
    for preset in PRESETS:
        mha = cache_bytes_per_token(config(preset, {}))
        for name, overrides in cache_variants(preset):
            cfg = config(preset, overrides)
            device = "cpu" if preset == "tiny" else "meta"  # meta: real code path, real shapes, no memory
            cells = []
            cross = []
            for dtype in DTYPES.values():
                formula = cache_bytes_per_token(cfg, dtype)
                self_measured, cross_measured = measured_bytes_per_token(cfg, dtype, device)
                if (self_measured, cross_measured) != (formula, formula):
                    raise SystemExit(f"{preset} {name} {dtype}: formula {formula} B, measured self {self_measured} B, "
                                     f"cross {cross_measured} B per token per layer")
                cells += [f"{formula:,}", f"{self_measured:,}", f"{formula * cfg.n_layers:,}"]
                cross.append(f"{cross_measured:,}")
            rows.append([preset, name, f"{cfg.kv_heads} x {cfg.head_dim}", cfg.n_layers, *cells, " / ".join(cross),
                         f"{cache_bytes_per_token(cfg) / mha:.3g}x"])
    header = ["preset", "variant", "n_kv_heads x head_dim", "layers", "fp32 B/token/layer formula", "measured",
              "fp32 B/token, all layers", "bf16 B/token/layer formula", "measured", "bf16 B/token, all layers",
              "cross B/source token/layer fp32 / bf16 (formula = measured)", "vs MHA"]
    return markdown_table(header, rows)


def decode_once(model: Transformer, src: torch.Tensor, n_new: int) -> tuple[float, int]:
    """Seconds to encode ``src`` ``(B, S)`` and generate exactly ``n_new`` tokens per row with the
    KV cache (greedy, special tokens forbidden), and the cache's ``nbytes`` at the end."""
    B = src.shape[0]
    forbidden = torch.tensor([PAD_ID, BOS_ID, EOS_ID, UNK_ID])
    with torch.inference_mode():
        t0 = time.perf_counter()
        memory, src_pad_mask = model.encode(src)
        cache = model.new_kv_cache(B, n_new)
        tok = torch.full((B, 1), BOS_ID, dtype=torch.long)  # (B, 1)
        for step in range(n_new):
            mem, mask = (memory, src_pad_mask) if step == 0 else (None, None)
            logits = model.decode(tok, mem, mask, kv_cache=cache)[:, -1]  # (B, V)
            logits[:, forbidden] = -torch.inf
            tok = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        seconds = time.perf_counter() - t0
    assert cache.length == n_new
    return seconds, cache.nbytes


def decode_table(rounds: int, shapes: list[tuple[int, int, int]]) -> str:
    """Table 2: CPU decoding of the tiny preset: ``shapes`` = (batch, source tokens, generated tokens)."""
    gen = torch.Generator().manual_seed(0)
    models, sources = {}, {}
    for name, overrides in cache_variants("tiny"):
        torch.manual_seed(0)
        models[name] = Transformer(config("tiny", overrides, max_positions=max(s for _, s, _ in shapes) + 8)).eval()
    for batch, src_len, _ in shapes:
        sources[batch, src_len] = torch.randint(4, 8000, (batch, src_len), generator=gen)
    times: dict[tuple, list[float]] = {}
    nbytes: dict[tuple, int] = {}
    for batch, src_len, n_new in shapes:  # warm-up, untimed
        for name, model in models.items():
            decode_once(model, sources[batch, src_len], n_new)
    for _ in range(rounds):  # every shape and variant once per round
        for batch, src_len, n_new in shapes:
            for name, model in models.items():
                seconds, nbytes[name, batch] = decode_once(model, sources[batch, src_len], n_new)
                times.setdefault((name, batch), []).append(seconds)
    rows = []
    median_tps: dict[tuple, float] = {}
    for batch, src_len, n_new in shapes:
        for name, model in models.items():
            cfg = model.cfg
            tps = Spread.of(batch * n_new / s for s in times[name, batch])
            median_tps[name, batch] = tps.median
            kv = cache_bytes(cfg, batch_size=batch, tgt_len=n_new, src_len=src_len)
            if nbytes[name, batch] != kv + batch * src_len:  # + the bool source padding mask
                raise SystemExit(f"tiny {name} batch {batch}: cache.nbytes {nbytes[name, batch]} != formula {kv} + mask")
            self_b = cfg.n_layers * batch * n_new * cache_bytes_per_token(cfg)
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            rows.append([name, f"{batch} x {src_len} x {n_new}", f"{tps.median:.0f}", f"{tps.low:.0f}-{tps.high:.0f}",
                         f"{nbytes[name, batch]:,}", f"{self_b:,} / {kv - self_b:,}", f"{weights:,}",
                         f"{tps.median / median_tps[name, shapes[0][0]]:.2f}x"])
    header = ["variant", "batch x source x generated", "generated tokens/s (median)", "min-max", "cache bytes (measured)",
              "of which self / cross K+V", "weights bytes", "tokens/s vs batch 1"]
    return markdown_table(header, rows)


def gpu_table() -> str:
    """Table 3: computed, not measured: the big preset's cache and the bandwidth bound of one decode step."""
    dtype = torch.bfloat16
    rows = []
    for name, overrides in cache_variants("big"):
        cfg = config("big", overrides, vocab_size=PAPER_VOCAB)
        weights = decoder_step_weight_bytes(cfg, dtype)
        for batch, tokens in GPU_SHAPES:
            kv = cache_bytes(cfg, batch_size=batch, tgt_len=tokens, src_len=tokens, dtype=dtype)
            step_s = (weights + kv) / GPU_BANDWIDTH
            rows.append([name, f"{batch} x ({tokens} + {tokens})", f"{kv / 1e6:,.1f} MB", f"{weights / 1e6:,.1f} MB",
                         f"{(weights + kv) / 1e6:,.1f} MB", f"{kv / (weights + kv):.0%}", f"{step_s * 1e3:.3f}",
                         f"{batch / step_s:,.0f}"])
    header = ["big preset, bf16", "batch x (source + generated) tokens", "KV cache bytes", "weights read/step",
              "bytes read/step (full cache)", "KV share of bytes read", "lower bound ms/step",
              "upper bound generated tokens/s"]
    return markdown_table(header, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round, short sequences (24 and 8 tokens)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds of the CPU decoding (alternating)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: robust on a shared 2-core host)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounds = 1 if args.quick else args.rounds
    long_, short = (24, 8) if args.quick else (100, 16)
    shapes = [(1, long_, long_), (32, short, short)]

    print(f"# KV-cache economics — {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, python {platform.python_version()}")
    print(host_line())
    print(f"command: python benchmarks/perf/kv_cache_economics.py {' '.join(sys.argv[1:])}".rstrip())
    print()
    print("## Cache bytes per token (formula = measured from the KVCache object; checked)")
    print()
    print(bytes_table())
    print()
    print(f"## CPU decoding, tiny preset, random init (seed 0), cached greedy, {rounds} alternating round(s), "
          f"fp32, {torch.get_num_threads()} thread(s) — measured")
    print()
    print(decode_table(rounds, shapes))
    print()
    print(f"## big preset on a GPU, bf16 — COMPUTED, not measured (bandwidth {GPU_BANDWIDTH:.1e} B/s assumed: "
          f"H200 HBM3e peak; vocabulary {PAPER_VOCAB}; source = generated length; last step, full cache)")
    print()
    print(gpu_table())


if __name__ == "__main__":
    main()
