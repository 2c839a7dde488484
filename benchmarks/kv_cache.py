"""KV-cache economics: the cache's bytes per token for each preset and variant, CPU decoding at
batch 1 x long input vs batch 32 x short input, and a computed GPU bound for the big preset.

    python benchmarks/kv_cache.py [--quick] [--rounds 7] [--threads 1]

Three tables (issue 15, item 4):

1. **Bytes per token** for every preset (tiny, base, big) and variant (the paper's MHA; GQA with
   ``n_kv_heads = n_heads / 4``, or 2 where that would be 1 (tiny); MQA ``n_kv_heads = 1``;
   ``positions`` rope and alibi with MHA), in float32 and bfloat16: the formula
   ``aiayn.model.kv_cache.cache_bytes_per_token`` (``2 * n_kv_heads * head_dim * bytes``: keys +
   values of one token in one decoder layer) against the bytes MEASURED from a real ``KVCache``
   filled by the model's own ``encode``/``decode`` (tiny: a real CPU model; base/big: the same code
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
   an ASSUMED 4.8e12 B/s (H200 HBM3e peak). Weights read per step: the decoder (without the
   cross-attention K/V projections, whose outputs are cached) and the tied output projection, at
   the paper's 37000-token vocabulary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time

import torch

from aiayn.config.schema import BOS_ID, EOS_ID, MODEL_PRESETS, PAD_ID, UNK_ID, ModelConfig, model_preset
from aiayn.model import Transformer
from aiayn.model.kv_cache import cache_bytes, cache_bytes_per_token

PRESETS = ("tiny", "base", "big")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GPU_BANDWIDTH = 4.8e12  # B/s, ASSUMED: NVIDIA H200 HBM3e peak bandwidth (data sheet)
GPU_SHAPES = ((1, 1024), (32, 64))  # (batch, tokens): source tokens = generated tokens = tokens
PAPER_VOCAB = 37000  # paper Sec. 5.1, shared BPE vocabulary


def variants(preset: str) -> list[tuple[str, dict]]:
    """(name, ModelConfig overrides) of the measured variants of ``preset``."""
    n_heads = MODEL_PRESETS[preset]["n_heads"]
    gqa = n_heads // 4 if n_heads % 4 == 0 and n_heads // 4 > 1 else 2
    return [
        ("MHA (paper)", {}),
        (f"GQA n_kv_heads={gqa}", {"n_kv_heads": gqa}),
        ("MQA n_kv_heads=1", {"n_kv_heads": 1}),
        ("rope (MHA)", {"positions": "rope"}),
        ("alibi (MHA)", {"positions": "alibi"}),
    ]


def config(preset: str, overrides: dict, **extra) -> ModelConfig:
    return model_preset(preset, attention_backend="sdpa", **overrides, **extra)


def measured_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype, device: str, *, batch: int = 2,
                             src_len: int = 7, max_len: int = 9) -> tuple[int, int]:
    """Self-attention bytes per target token per layer and cross-attention bytes per source token per
    layer, measured from the ``KVCache`` that the model's own ``new_kv_cache``/``encode``/``decode``
    fill (one decode step: the cross-attention keys/values are stored on the first)."""
    torch.manual_seed(0)
    model = Transformer(cfg, device=device).eval().to(dtype)
    src = torch.randint(4, cfg.vocab_size, (batch, src_len), device=device)
    with torch.inference_mode():
        memory, src_pad_mask = model.encode(src)
        cache = model.new_kv_cache(batch, max_len)
        model.decode(torch.full((batch, 1), BOS_ID, device=device), memory, src_pad_mask, kv_cache=cache)
    assert cache.k_cache[0].dtype == dtype and cache.cross_k[0].dtype == dtype and cache.has_cross
    self_slots, cross_slots = batch * max_len * cache.n_layers, batch * src_len * cache.n_layers
    assert cache.self_nbytes % self_slots == 0 and cache.cross_nbytes % cross_slots == 0
    return cache.self_nbytes // self_slots, cache.cross_nbytes // cross_slots


def bytes_table() -> list[str]:
    lines = [
        "| preset | variant | n_kv_heads x head_dim | layers | fp32 B/token/layer formula | measured | fp32 B/token, all layers "
        "| bf16 B/token/layer formula | measured | bf16 B/token, all layers | cross B/source token/layer fp32 / bf16 (formula = measured) "
        "| vs MHA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for preset in PRESETS:
        mha = cache_bytes_per_token(config(preset, {}))
        for name, overrides in variants(preset):
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
            ratio = cache_bytes_per_token(cfg) / mha
            lines.append(f"| {preset} | {name} | {cfg.kv_heads} x {cfg.head_dim} | {cfg.n_layers} | {' | '.join(cells)} "
                         f"| {' / '.join(cross)} | {ratio:.3g}x |")
    return lines


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


def decode_table(rounds: int, shapes: list[tuple[int, int, int]]) -> list[str]:
    """CPU decoding of the tiny preset: ``shapes`` = (batch, source tokens, generated tokens)."""
    gen = torch.Generator().manual_seed(0)
    models, sources = {}, {}
    for name, overrides in variants("tiny"):
        torch.manual_seed(0)
        models[name] = Transformer(config("tiny", overrides, max_positions=max(s for _, s, _ in shapes) + 8)).eval()
    for batch, src_len, _ in shapes:
        sources[batch, src_len] = torch.randint(4, 8000, (batch, src_len), generator=gen)
    times: dict[tuple, list[float]] = {}
    nbytes: dict[tuple, int] = {}
    for batch, src_len, n_new in shapes:  # warm-up, untimed
        for name, model in models.items():
            decode_once(model, sources[batch, src_len], n_new)
    for _ in range(rounds):  # alternating: every shape and variant once per round
        for batch, src_len, n_new in shapes:
            for name, model in models.items():
                seconds, nbytes[name, batch] = decode_once(model, sources[batch, src_len], n_new)
                times.setdefault((name, batch), []).append(seconds)
    lines = [
        "| variant | batch x source x generated | generated tokens/s (median) | min-max | cache bytes (measured) "
        "| of which self / cross K+V | weights bytes | tokens/s vs batch 1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    median_tps: dict[tuple, float] = {}
    for batch, src_len, n_new in shapes:
        for name, model in models.items():
            cfg = model.cfg
            tps = sorted(batch * n_new / s for s in times[name, batch])
            median_tps[name, batch] = statistics.median(tps)
            kv = cache_bytes(cfg, batch_size=batch, tgt_len=n_new, src_len=src_len)
            if nbytes[name, batch] != kv + batch * src_len:  # + the bool source padding mask
                raise SystemExit(f"tiny {name} batch {batch}: cache.nbytes {nbytes[name, batch]} != formula {kv} + mask")
            self_b = cfg.n_layers * batch * n_new * cache_bytes_per_token(cfg)
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            first = shapes[0][0]
            lines.append(
                f"| {name} | {batch} x {src_len} x {n_new} | {median_tps[name, batch]:.0f} | {tps[0]:.0f}-{tps[-1]:.0f} "
                f"| {nbytes[name, batch]:,} | {self_b:,} / {kv - self_b:,} | {weights:,} "
                f"| {median_tps[name, batch] / median_tps[name, first]:.2f}x |"
            )
    return lines


def decoder_step_weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Parameter bytes one decode step reads: decoder layers without the cross-attention K/V
    projections (their outputs are cached), the decoder's final norm and the tied output projection."""
    model = Transformer(cfg, device="meta")
    n = 0
    for name, p in model.named_parameters():  # the tied embedding appears once, as tgt_embed
        cross_kv = ".cross_attn.k_proj." in name or ".cross_attn.v_proj." in name
        if (name.startswith("decoder_") and not cross_kv) or name.startswith("tgt_embed."):
            n += p.numel()
    return n * dtype.itemsize


def gpu_table() -> list[str]:
    dtype = torch.bfloat16
    lines = [
        "| big preset, bf16 | batch x (source + generated) tokens | KV cache bytes | weights read/step | bytes read/step (full cache) "
        "| KV share of bytes read | lower bound ms/step | upper bound generated tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, overrides in variants("big"):
        cfg = config("big", overrides, vocab_size=PAPER_VOCAB)
        weights = decoder_step_weight_bytes(cfg, dtype)
        for batch, tokens in GPU_SHAPES:
            kv = cache_bytes(cfg, batch_size=batch, tgt_len=tokens, src_len=tokens, dtype=dtype)
            step_s = (weights + kv) / GPU_BANDWIDTH
            lines.append(f"| {name} | {batch} x ({tokens} + {tokens}) | {kv / 1e6:,.1f} MB | {weights / 1e6:,.1f} MB "
                         f"| {(weights + kv) / 1e6:,.1f} MB | {kv / (weights + kv):.0%} | {step_s * 1e3:.3f} "
                         f"| {batch / step_s:,.0f} |")
    return lines


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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

    print(f"# KV-cache economics — {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu_name()}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, python {platform.python_version()}")
    print(f"command: python benchmarks/kv_cache.py {' '.join(sys.argv[1:])}".rstrip())
    print()
    print("## Cache bytes per token (formula = measured from the KVCache object; checked)")
    print()
    print("\n".join(bytes_table()))
    print()
    print(f"## CPU decoding, tiny preset, random init (seed 0), cached greedy, {rounds} alternating round(s), "
          f"fp32, {torch.get_num_threads()} thread(s) — measured")
    print()
    print("\n".join(decode_table(rounds, shapes)))
    print()
    print(f"## big preset on a GPU, bf16 — COMPUTED, not measured (bandwidth {GPU_BANDWIDTH:.1e} B/s assumed: "
          f"H200 HBM3e peak; vocabulary {PAPER_VOCAB}; source = generated length; last step, full cache)")
    print()
    print("\n".join(gpu_table()))


if __name__ == "__main__":
    main()
