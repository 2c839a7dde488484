"""What the KV cache costs, measured against its formula, and what one decode step reads.

- ``cache_variants(preset)``: the attention variants whose cache differs from the paper's multi-head attention
  (grouped-query, multi-query) and two that must not change it (rotary, ALiBi positions);
- ``measured_bytes_per_token``: the bytes per token per layer a real ``KVCache`` holds once the model's own
  ``encode``/``decode`` filled it, to hold against ``kv_cache.cache_bytes_per_token`` (the formula); on the
  'meta' device it runs the same code path with the real shapes and dtypes and allocates nothing, so the
  base and big presets cost nothing to check;
- ``decoder_step_weight_bytes``: the parameter bytes one decode step reads (the bandwidth side of a step: weights
  read + cache read, over the memory bandwidth, bounds its time from below).

``benchmarks/perf/kv_cache_economics.py`` prints the tables (docs/results.md, "KV-cache economics").
"""

from __future__ import annotations

import torch

from aiayn.config.schema import BOS_ID, MODEL_PRESETS, ModelConfig
from aiayn.model.transformer import Transformer

__all__ = ["cache_variants", "decoder_step_weight_bytes", "measured_bytes_per_token"]


def cache_variants(preset: str) -> list[tuple[str, dict]]:
    """``(name, ModelConfig overrides)`` of ``preset``'s variants: the paper's MHA; GQA with ``n_kv_heads =
    n_heads / 4`` (2 where that would be 1, i.e. MQA); MQA ``n_kv_heads = 1``; rope and alibi positions with MHA."""
    n_heads = MODEL_PRESETS[preset]["n_heads"]
    gqa = n_heads // 4 if n_heads % 4 == 0 and n_heads // 4 > 1 else 2
    return [
        ("MHA (paper)", {}),
        (f"GQA n_kv_heads={gqa}", {"n_kv_heads": gqa}),
        ("MQA n_kv_heads=1", {"n_kv_heads": 1}),
        ("rope (MHA)", {"positions": "rope"}),
        ("alibi (MHA)", {"positions": "alibi"}),
    ]


def measured_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype, device: str, *, batch: int = 2,
                             src_len: int = 7, max_len: int = 9) -> tuple[int, int]:
    """``(self, cross)``: self-attention bytes per target token per layer and cross-attention bytes per source
    token per layer, measured from the ``KVCache`` that the model's own ``new_kv_cache``/``encode``/``decode``
    fill in one decode step (the cross-attention keys/values are stored on the first). An encoder-decoder
    ``cfg``; ``device`` 'cpu' (a real model) or 'meta' (shapes only)."""
    torch.manual_seed(0)
    model = Transformer(cfg, device=device).eval().to(dtype)
    src = torch.randint(4, cfg.vocab_size, (batch, src_len), device=device)
    with torch.inference_mode():
        memory, src_pad_mask = model.encode(src)
        cache = model.new_kv_cache(batch, max_len)
        model.decode(torch.full((batch, 1), BOS_ID, device=device), memory, src_pad_mask, kv_cache=cache)
    if not (cache.k_cache[0].dtype == dtype and cache.cross_k[0].dtype == dtype and cache.has_cross):
        raise ValueError(f"the cache does not hold {dtype} self and cross keys/values")
    self_slots, cross_slots = batch * max_len * cache.n_layers, batch * src_len * cache.n_layers
    if cache.self_nbytes % self_slots or cache.cross_nbytes % cross_slots:
        raise ValueError(f"cache bytes {cache.self_nbytes} / {cache.cross_nbytes} are not whole per token")
    return cache.self_nbytes // self_slots, cache.cross_nbytes // cross_slots


def decoder_step_weight_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """Parameter bytes one decode step reads: the decoder layers without the cross-attention K/V projections
    (their outputs are cached), the decoder's final norm and the tied output projection (counted once, as
    ``tgt_embed``)."""
    model = Transformer(cfg, device="meta")
    n = 0
    for name, p in model.named_parameters():
        cross_kv = ".cross_attn.k_proj." in name or ".cross_attn.v_proj." in name
        if (name.startswith("decoder_") and not cross_kv) or name.startswith("tgt_embed."):
            n += p.numel()
    return n * dtype.itemsize
