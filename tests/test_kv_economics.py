"""KV-cache bytes per token: the formula (``aiayn.model.kv_cache.cache_bytes_per_token``) against the
bytes held by a real ``KVCache`` that the model fills (``aiayn.model.kv_economics``), for every preset and
variant that ``benchmarks/perf/kv_cache_economics.py`` tables, plus hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from aiayn.config.schema import model_preset
from aiayn.model.kv_cache import KVCache, cache_bytes, cache_bytes_per_token
from aiayn.model.kv_economics import cache_variants, decoder_step_weight_bytes, measured_bytes_per_token

PRESETS = ("tiny", "base", "big")
CASES = [(preset, name, overrides) for preset in PRESETS for name, overrides in cache_variants(preset)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("preset", "name", "overrides"), CASES, ids=[f"{p}-{n}" for p, n, _ in CASES])
def test_formula_equals_the_measured_cache(preset, name, overrides, dtype):
    """tiny: a real CPU model; base/big: the same encode/decode on 'meta' (real shapes, no memory)."""
    cfg = model_preset(preset, attention_backend="sdpa", **overrides)
    device = "cpu" if preset == "tiny" else "meta"
    self_b, cross_b = measured_bytes_per_token(cfg, dtype, device)
    assert self_b == cross_b == cache_bytes_per_token(cfg, dtype)


def test_hand_computed_bytes_per_token():
    """2 (K, V) x n_kv_heads x head_dim x bytes per element, one decoder layer."""
    assert cache_bytes_per_token(model_preset("base")) == 2 * 8 * 64 * 4 == 4096
    assert cache_bytes_per_token(model_preset("base"), torch.bfloat16) == 2048
    assert cache_bytes_per_token(model_preset("big")) == 2 * 16 * 64 * 4 == 8192
    assert cache_bytes_per_token(model_preset("big", n_kv_heads=4), torch.bfloat16) == 2 * 4 * 64 * 2 == 1024
    assert cache_bytes_per_token(model_preset("big", n_kv_heads=1), torch.bfloat16) == 256  # MQA: 1/16 of MHA
    assert cache_bytes_per_token(model_preset("tiny", positions="rope")) == cache_bytes_per_token(model_preset("tiny"))
    assert cache_bytes_per_token(model_preset("tiny", positions="alibi")) == 2 * 4 * 64 * 4 == 2048
    # base, batch 2, 5 target + 3 source tokens, 6 layers, fp32
    assert cache_bytes(model_preset("base"), batch_size=2, tgt_len=5, src_len=3) == 6 * 2 * 8 * 4096
    assert [n for n, _ in cache_variants("tiny")][1] == "GQA n_kv_heads=2"  # tiny: n_heads / 4 would be MQA
    assert [n for n, _ in cache_variants("big")][1] == "GQA n_kv_heads=4"


def test_a_decode_step_reads_the_decoder_without_its_cached_cross_projections():
    """Tiny (post-norm: no final norm), vocabulary 1000: the tied output projection, and per decoder layer
    self-attention's 4 projections, cross-attention's query and output ones (its K/V outputs are cached),
    the FFN and three layer norms."""
    cfg = model_preset("tiny", vocab_size=1000)
    d, ff = cfg.d_model, cfg.d_ff
    per_layer = 6 * (d * d + d) + (d * ff + ff) + (ff * d + d) + 3 * 2 * d
    assert decoder_step_weight_bytes(cfg, torch.float32) == 4 * (1000 * d + cfg.n_layers * per_layer)
    assert decoder_step_weight_bytes(cfg, torch.bfloat16) == 2 * (1000 * d + cfg.n_layers * per_layer)


def test_kv_cache_byte_counters():
    cache = KVCache(n_layers=3, batch_size=2, n_kv_heads=2, head_dim=4, max_len=5, dtype=torch.bfloat16)
    assert cache.self_nbytes == 3 * 2 * 2 * 2 * 5 * 4 * 2 and cache.cross_nbytes == 0  # layers x (k, v) x B x ...
    for layer in range(3):
        cache.set_cross(layer, torch.zeros(2, 2, 7, 4, dtype=torch.bfloat16), torch.zeros(2, 2, 7, 4, dtype=torch.bfloat16))
    cache.src_pad_mask = torch.zeros(2, 7, dtype=torch.bool)
    assert cache.cross_nbytes == 3 * 2 * 2 * 2 * 7 * 4 * 2
    assert cache.nbytes == cache.self_nbytes + cache.cross_nbytes + 2 * 7
