"""Transformer model: parameter counts vs the paper, attention backends, padding invariance, KV cache.

Tolerances: float32 comparisons use atol 1e-5 (values are O(1); summation order differs between
backends and batch shapes); float64 comparisons use 1e-10.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from aiayn.config.schema import BOS_ID, PAD_ID, model_preset
from aiayn.model import KVCache, Transformer, select_backend, sinusoid_table
from aiayn.model.attention import attend_reference, attend_sdpa, attend_triton

F32_ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_cfg(**overrides):
    base = dict(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_positions=64,
                attention_backend="sdpa")  # fmt: skip
    return model_preset("tiny", **{**base, **overrides})


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_cfg(**overrides)).eval()


def random_tokens(gen: torch.Generator, B: int, T: int, lengths: list[int], vocab: int = 50) -> torch.Tensor:
    """(B, T) ids in [4, vocab), right-padded with PAD to ``lengths``."""
    x = torch.randint(4, vocab, (B, T), generator=gen)
    for b, n in enumerate(lengths):
        x[b, n:] = PAD_ID
    return x


# ---------------------------------------------------------------- parameter counts (paper Table 3)


def analytic_count(d_model: int, d_ff: int, n_layers: int, vocab: int) -> int:
    """Paper architecture with biases everywhere but the tied output projection, one shared embedding."""
    attn = 4 * (d_model * d_model + d_model)  # q, k, v, out projections
    ffn = d_model * d_ff + d_ff + d_ff * d_model + d_model
    ln = 2 * d_model
    enc = attn + ffn + 2 * ln
    dec = 2 * attn + ffn + 3 * ln
    return vocab * d_model + n_layers * (enc + dec)


@pytest.mark.parametrize(("preset", "paper_millions"), [("base", 65), ("big", 213)])
def test_parameter_count_matches_paper(preset, paper_millions):
    cfg = model_preset(preset, vocab_size=37000)  # paper: shared 37000-token BPE vocabulary (Sec. 5.1)
    model = Transformer(cfg, device="meta")
    n = model.num_parameters()
    assert n == analytic_count(cfg.d_model, cfg.d_ff, cfg.n_layers, 37000)
    assert abs(n - paper_millions * 1e6) / (paper_millions * 1e6) < 0.05, n


def test_gqa_shrinks_kv_projections():
    full = Transformer(tiny_cfg(n_kv_heads=None), device="meta").num_parameters()
    mqa = Transformer(tiny_cfg(n_kv_heads=1), device="meta").num_parameters()
    # k and v projections shrink from d_model to head_dim outputs in 3 attention blocks x 2 layers.
    d, hd = 32, 8
    assert full - mqa == 3 * 2 * 2 * (d * (d - hd) + (d - hd))



def _forward_and_cached_decode(model: Transformer, src: torch.Tensor, tgt: torch.Tensor):
    """Teacher-forced logits, the same logits from cached decoding (2-token prefill, then 1 token a
    step), and the cache."""
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        memory, src_pad_mask = model.encode(src)
        cache = model.new_kv_cache(src.shape[0], tgt.shape[1])
        steps = [model.decode(tgt[:, :2], memory, src_pad_mask, kv_cache=cache)]
        steps += [model.decode(tgt[:, t : t + 1], None, None, kv_cache=cache) for t in range(2, tgt.shape[1])]
    return full, torch.cat(steps, dim=1), cache


def _param_shapes(model: Transformer) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(t.shape)) for name, t in model.state_dict().items()]


@pytest.mark.parametrize(
    "overrides", [{}, {"positions": "rope"}, {"positions": "alibi"}, {"attention_backend": "reference", "norm": "pre"}]
)
def test_gqa_with_n_kv_heads_equal_to_n_heads_is_mha_exactly(overrides):
    """GQA with ``n_kv_heads = n_heads`` is the paper's MHA (``n_kv_heads=None``) exactly: the same
    parameter names and shapes, the same initialisation from the same seed, and bitwise-equal
    teacher-forced logits and cached decoding (the cache holds all ``n_heads`` heads)."""
    gen = torch.Generator().manual_seed(16)
    mha = tiny_model(seed=3, n_kv_heads=None, **overrides)
    gqa = tiny_model(seed=3, n_kv_heads=4, **overrides)
    assert mha.cfg.n_kv_heads is None and gqa.cfg.n_kv_heads == gqa.cfg.n_heads == mha.cfg.kv_heads == 4
    assert _param_shapes(gqa) == _param_shapes(mha)
    assert all(torch.equal(a, b) for a, b in zip(gqa.state_dict().values(), mha.state_dict().values()))
    gqa.load_state_dict(mha.state_dict())
    src = random_tokens(gen, 3, 8, [8, 3, 6])
    tgt = random_tokens(gen, 3, 6, [6, 6, 6])
    tgt[:, 0] = BOS_ID
    full_mha, steps_mha, cache_mha = _forward_and_cached_decode(mha, src, tgt)
    full_gqa, steps_gqa, cache_gqa = _forward_and_cached_decode(gqa, src, tgt)
    assert torch.equal(full_gqa, full_mha)
    assert torch.equal(steps_gqa, steps_mha)
    assert cache_gqa.k_cache[0].shape == cache_mha.k_cache[0].shape == (3, 4, 6, 8)  # (B, n_heads, T, head_dim)
    assert cache_gqa.nbytes == cache_mha.nbytes
    assert all(torch.equal(a, b) for a, b in zip(cache_gqa.k_cache + cache_gqa.cross_v, cache_mha.k_cache + cache_mha.cross_v))
    # The comparison has teeth: fewer K/V heads changes the K/V projections' shapes.
    assert _param_shapes(tiny_model(seed=3, n_kv_heads=2, **overrides)) != _param_shapes(mha)


def test_gqa_equals_mha_with_each_kv_head_repeated_over_its_group():
    """GQA (Ainslie et al. 2023, Sec. 2.2) is MHA whose K/V heads are shared within groups of
    ``n_heads / n_kv_heads`` query heads: copying each GQA K/V head into the MHA heads of its group
    gives the same model (query head ``h`` reads K/V head ``h // group``), at half the cache."""
    gen = torch.Generator().manual_seed(17)
    gqa = tiny_model(seed=4, n_kv_heads=2)  # 4 query heads, 2 K/V heads of head_dim 8
    mha = tiny_model(seed=5, n_kv_heads=None)
    state = dict(gqa.state_dict())
    for name, t in state.items():
        if any(f"attn.{p}_proj." in name for p in ("k", "v")):  # (2 * 8, ...) -> (4 * 8, ...)
            state[name] = t.view(2, 8, *t.shape[1:]).repeat_interleave(2, dim=0).reshape(32, *t.shape[1:])
    mha.load_state_dict(state)
    src = random_tokens(gen, 2, 7, [7, 4])
    tgt = random_tokens(gen, 2, 5, [5, 5])
    tgt[:, 0] = BOS_ID
    full_gqa, steps_gqa, cache_gqa = _forward_and_cached_decode(gqa, src, tgt)
    full_mha, steps_mha, cache_mha = _forward_and_cached_decode(mha, src, tgt)
    torch.testing.assert_close(full_mha, full_gqa, atol=F32_ATOL, rtol=0)
    torch.testing.assert_close(steps_mha, steps_gqa, atol=F32_ATOL, rtol=0)
    mask_bytes = src.numel()  # the bool src_pad_mask (2, 7) does not shrink; the K/V tensors halve
    assert cache_mha.nbytes - mask_bytes == 2 * (cache_gqa.nbytes - mask_bytes)


def test_embeddings_tied_and_initialised():
    model = tiny_model(d_model=64, n_heads=4, vocab_size=4000)
    assert model.src_embed.weight is model.tgt_embed.weight
    matrices = [p for p in model.parameters() if p.shape == (4000, 64)]
    assert len(matrices) == 1  # no separate output projection
    w = model.tgt_embed.weight.detach()
    assert torch.all(w[PAD_ID] == 0)
    assert abs(w[1:].std().item() - 64**-0.5) < 0.05 * 64**-0.5
    lin = model.encoder_layers[0].ffn.w1
    bound = math.sqrt(6.0 / (lin.in_features + lin.out_features))  # xavier uniform
    assert lin.weight.abs().max() <= bound and lin.weight.abs().max() > 0.9 * bound
    assert torch.all(lin.bias == 0)
    untied = tiny_model(share_embeddings=False)
    assert untied.src_embed.weight is not untied.tgt_embed.weight


def test_positions_follow_paper_formula():
    d = 10
    table = sinusoid_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


# ---------------------------------------------------------------- attention backends


def naive_attention(q, k, v, causal, key_padding_mask):
    """Loop-per-query float64 attention: the independent ground truth."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    out = torch.zeros(B, H, Tq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            kh = h // (H // Hkv)
            for i in range(Tq):
                keys = [j for j in range(Tk)
                        if not (key_padding_mask is not None and key_padding_mask[b, j])
                        and not (causal and j > i + Tk - Tq)]  # fmt: skip
                if not keys:
                    continue
                s = torch.stack([q[b, h, i].double() @ k[b, kh, j].double() / math.sqrt(D) for j in keys])
                p = torch.softmax(s, dim=0)
                out[b, h, i] = sum(p[n] * v[b, kh, j].double() for n, j in enumerate(keys))
    return out


CASES = [  # (Tq, Tk, causal, lengths or None)
    (5, 5, True, None),
    (5, 5, True, [5, 3, 1]),
    (4, 7, False, [7, 2, 5]),
    (1, 6, True, [6, 6, 6]),  # one query after a cache: sees every key
    (3, 6, True, None),  # bottom-right aligned causality
]


@pytest.mark.parametrize("backend", [attend_reference, attend_sdpa])
@pytest.mark.parametrize(("Tq", "Tk", "causal", "lengths"), CASES)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_backend_matches_naive(backend, Tq, Tk, causal, lengths, n_kv_heads):
    gen = torch.Generator().manual_seed(Tq * 100 + Tk + n_kv_heads)
    B, H, D = 3, 4, 8
    q = torch.randn(B, H, Tq, D, generator=gen)
    k = torch.randn(B, n_kv_heads, Tk, D, generator=gen)
    v = torch.randn(B, n_kv_heads, Tk, D, generator=gen)
    mask = None if lengths is None else torch.arange(Tk)[None, :] >= torch.tensor(lengths)[:, None]  # (B, Tk)
    out = backend(q, k, v, causal=causal, key_padding_mask=mask, dropout_p=0.0)
    assert out.shape == (B, H, Tq, D) and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, causal, mask), atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("backend", [attend_reference, attend_sdpa])
def test_fully_masked_row_gives_zeros(backend):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 3, 4, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 5, 4, generator=gen)
    v = torch.randn(2, 2, 5, 4, generator=gen)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1] = True  # row 1: every key is padding
    out = backend(q, k, v, causal=False, key_padding_mask=mask, dropout_p=0.0)
    assert torch.all(out[1] == 0)
    assert torch.isfinite(out).all() and out[0].abs().sum() > 0
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_triton_backend_rejects_what_the_kernel_cannot_do():
    q = k = v = torch.randn(2, 2, 4, 8)
    left_pad = torch.tensor([[True, False, False, False], [False, False, False, False]])
    with pytest.raises(ValueError, match="right padding"):
        attend_triton(q, k, v, causal=False, key_padding_mask=left_pad, dropout_p=0.0)
    with pytest.raises(ValueError, match="dropout"):
        attend_triton(q, k, v, causal=False, key_padding_mask=None, dropout_p=0.1)
    with pytest.raises(ValueError, match="Tq == Tk"):
        attend_triton(q[:, :, :2], k, v, causal=True, key_padding_mask=None, dropout_p=0.0)


def test_triton_backend_matches_reference():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 16, 16, generator=gen)
    k = torch.randn(2, 2, 16, 16, generator=gen)
    v = torch.randn(2, 2, 16, 16, generator=gen)
    mask = torch.arange(16)[None, :] >= torch.tensor([16, 9])[:, None]
    for causal in (False, True):
        ref = attend_reference(q, k, v, causal=causal, key_padding_mask=mask, dropout_p=0.0)
        out = attend_triton(q, k, v, causal=causal, key_padding_mask=mask, dropout_p=0.0)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=0)


def test_select_backend(caplog):
    with caplog.at_level(logging.INFO, logger="aiayn"):
        assert select_backend("auto", "cpu")[0] == "sdpa"
        assert select_backend("reference", "cpu") == ("reference", attend_reference)
    assert "attention backend: sdpa" in caplog.text
    with pytest.raises(ValueError, match="'flash'"):
        select_backend("flash", "cpu")


def test_model_reference_and_sdpa_backends_agree():
    gen = torch.Generator().manual_seed(1)
    sdpa = tiny_model(attention_backend="sdpa")
    ref = tiny_model(attention_backend="reference")
    ref.load_state_dict(sdpa.state_dict())
    assert (sdpa.attention_backend, ref.attention_backend) == ("sdpa", "reference")
    src = random_tokens(gen, 3, 9, [9, 4, 1])
    tgt = random_tokens(gen, 3, 7, [7, 7, 2])
    torch.testing.assert_close(sdpa(src, tgt), ref(src, tgt), atol=F32_ATOL, rtol=0)


# ---------------------------------------------------------------- padding invariance


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_target_padding_does_not_change_real_positions(norm):
    gen = torch.Generator().manual_seed(2)
    model = tiny_model(norm=norm)
    src = random_tokens(gen, 2, 6, [6, 3])
    tgt = random_tokens(gen, 2, 5, [5, 5])
    padded = torch.cat([tgt, torch.full((2, 4), PAD_ID)], dim=1)  # (2, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(src, padded)[:, :5], model(src, tgt), atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_source_padding_does_not_change_output(backend):
    """A sentence alone and inside a right-padded batch of longer ones: same logits (atol 1e-5)."""
    gen = torch.Generator().manual_seed(4)
    model = tiny_model(attention_backend=backend)
    batch_src = random_tokens(gen, 3, 12, [12, 3, 8])
    batch_tgt = random_tokens(gen, 3, 6, [6, 2, 6])
    with torch.no_grad():
        batch_logits = model(batch_src, batch_tgt)
        for b, (ns, nt) in enumerate([(12, 6), (3, 2), (8, 6)]):
            alone = model(batch_src[b : b + 1, :ns], batch_tgt[b : b + 1, :nt])
            torch.testing.assert_close(batch_logits[b : b + 1, :nt], alone, atol=F32_ATOL, rtol=0)


# ---------------------------------------------------------------- KV cache


VARIANTS = [{"positions": "learned"}, {"positions": "rope"}, {"positions": "alibi"}, {"norm_type": "rmsnorm"},
            {"positions": "rope", "norm": "pre", "norm_type": "rmsnorm", "activation": "swiglu", "n_kv_heads": 1},
            {"positions": "alibi", "attention_backend": "reference", "n_heads": 8, "n_kv_heads": 2}]


@pytest.mark.parametrize(
    "overrides",
    [{}, {"norm": "pre"}, {"activation": "gelu"}, {"activation": "swiglu", "n_kv_heads": 1},
     {"attention_backend": "reference", "n_kv_heads": None}, *VARIANTS],  # fmt: skip
)
def test_cached_decode_matches_full_recompute(overrides):
    gen = torch.Generator().manual_seed(6)
    model = tiny_model(**overrides)
    src = random_tokens(gen, 3, 7, [7, 2, 5])
    tgt = random_tokens(gen, 3, 6, [6, 6, 6])
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        memory, src_pad_mask = model.encode(src)
        full = model.decode(tgt, memory, src_pad_mask)  # (3, 6, V)
        cache = model.new_kv_cache(3, 8)
        steps = [model.decode(tgt[:, :2], memory, src_pad_mask, kv_cache=cache)]  # a 2-token prefill
        for t in range(2, 6):
            steps.append(model.decode(tgt[:, t : t + 1], None, None, kv_cache=cache))
    assert cache.length == 6 and cache.has_cross
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("overrides", VARIANTS)
def test_variants_are_padding_invariant(overrides):
    """Source padding and target padding leave real positions unchanged for every variant."""
    gen = torch.Generator().manual_seed(14)
    model = tiny_model(**overrides)
    src = random_tokens(gen, 2, 9, [9, 4])
    tgt = random_tokens(gen, 2, 5, [5, 5])
    with torch.no_grad():
        both = model(src, tgt)
        torch.testing.assert_close(model(src[1:, :4], tgt[1:]), both[1:], atol=F32_ATOL, rtol=0)
        padded = torch.cat([tgt, torch.full((2, 3), PAD_ID)], dim=1)
        torch.testing.assert_close(model(src, padded)[:, :5], both, atol=F32_ATOL, rtol=0)


def test_variant_parameter_counts():
    """learned adds the table; rope and alibi add nothing; rmsnorm drops every norm bias."""
    cfg = tiny_cfg(n_kv_heads=None)
    base = Transformer(cfg, device="meta").num_parameters()
    count = lambda **o: Transformer(tiny_cfg(n_kv_heads=None, **o), device="meta").num_parameters()  # noqa: E731
    assert count(positions="learned") == base + cfg.max_positions * cfg.d_model
    assert count(positions="rope") == count(positions="alibi") == base
    n_norms = cfg.n_layers * (2 + 3)  # post-norm: 2 per encoder layer, 3 per decoder layer
    assert count(norm_type="rmsnorm") == base - n_norms * cfg.d_model
    assert count(norm_type="rmsnorm", norm="pre") == count(norm="pre") - (n_norms + 2) * cfg.d_model  # + final norms
    with pytest.raises(ValueError):
        tiny_cfg(positions="relative")


@pytest.mark.parametrize("preset", ["tiny", "base", "big"])
def test_swiglu_keeps_the_parameter_count(preset):
    """SwiGLU's hidden width is 2/3 d_ff (LLaMA): the model stays within 1 % of the ReLU model's parameters."""
    from aiayn.model.transformer import swiglu_hidden

    relu = Transformer(model_preset(preset), device="meta").num_parameters()
    swiglu = Transformer(model_preset(preset, activation="swiglu"), device="meta").num_parameters()
    assert abs(swiglu - relu) / relu < 0.01, (relu, swiglu)
    assert swiglu_hidden(2048) == 1368 and swiglu_hidden(512) == 344 and swiglu_hidden(9) == 8


def test_rope_and_alibi_depend_on_the_offset_only():
    """Shifting every position by the same amount leaves the attention scores unchanged."""
    from aiayn.model.positions import RotaryPositions, alibi_bias, alibi_slopes

    gen = torch.Generator().manual_seed(15)
    rope = RotaryPositions(head_dim=8, max_positions=64)
    q, k = torch.randn(2, 3, 5, 8, generator=gen), torch.randn(2, 3, 7, 8, generator=gen)
    scores = rope.rotate(q, 0) @ rope.rotate(k, 0).transpose(-1, -2)
    shifted = rope.rotate(q, 11) @ rope.rotate(k, 11).transpose(-1, -2)
    torch.testing.assert_close(shifted, scores, atol=F32_ATOL, rtol=0)
    assert not torch.allclose(rope.rotate(q, 0) @ rope.rotate(k, 3).transpose(-1, -2), scores, atol=1e-3)
    slopes = alibi_slopes(8)
    assert slopes.tolist() == [2.0 ** -(i + 1) for i in range(8)]  # Press et al. 2022: 1/2, 1/4, ..., 1/256
    # not a power of two: the 4-head slopes, then every other one of the 8-head slopes (their reference code)
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    a = alibi_bias(slopes, torch.arange(0, 5), torch.arange(0, 7))
    torch.testing.assert_close(alibi_bias(slopes, torch.arange(9, 14), torch.arange(9, 16)), a)
    assert a[0, 0, 4, 1].item() == -0.5 * 3


def test_alibi_bias_is_built_once_per_stack(monkeypatch):
    """The ALiBi bias is computed once per encode and once per decode call, shared by all layers."""
    import aiayn.model.transformer as transformer

    calls = []
    real = transformer.alibi_bias
    monkeypatch.setattr(transformer, "alibi_bias", lambda *a: calls.append(a) or real(*a))
    model = tiny_model(positions="alibi", n_layers=3)
    src, tgt = torch.full((2, 5), 7), torch.full((2, 4), 8)
    with torch.no_grad():
        model(src, tgt)
        assert len(calls) == 2  # encoder (5 x 5) + decoder (4 x 4), not once per layer
        memory, src_pad_mask = model.encode(src)
        cache = model.new_kv_cache(2, 4)
        model.decode(tgt[:, :3], memory, src_pad_mask, kv_cache=cache)
        model.decode(tgt[:, 3:], None, None, kv_cache=cache)
    assert len(calls) == 5
    assert [tuple(q.tolist()) for _, q, _ in calls[3:]] == [(0, 1, 2), (3,)]  # query positions
    assert [k.numel() for _, _, k in calls[3:]] == [3, 4]  # keys: cached + new


def test_alibi_with_the_triton_backend_falls_back_to_sdpa(caplog):
    with caplog.at_level(logging.INFO, logger="aiayn"):
        model = tiny_model(positions="alibi", attention_backend="triton")
    assert model.attention_backend == "sdpa"
    assert "positions='alibi' needs an additive score bias" in caplog.text
    with pytest.raises(ValueError, match="no additive score bias"):
        attend_triton(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), causal=False,
                      key_padding_mask=None, dropout_p=0.0, bias=torch.zeros(1, 1, 2, 2))


def test_kv_cache_reorder_and_nbytes():
    gen = torch.Generator().manual_seed(7)
    cache = KVCache(n_layers=2, batch_size=3, n_kv_heads=2, head_dim=4, max_len=5)
    assert cache.nbytes == 2 * 2 * 3 * 2 * 5 * 4 * 4  # layers x (k, v) x B x heads x max_len x head_dim x 4 bytes
    k, v = torch.randn(3, 2, 2, 4, generator=gen), torch.randn(3, 2, 2, 4, generator=gen)
    for layer in range(2):
        k_all, _ = cache.update(layer, k, v)
        assert k_all.shape == (3, 2, 2, 4)
        cache.set_cross(layer, k + 1, v + 1)
    cache.advance(2)
    cache.src_pad_mask = torch.tensor([[False, True], [False, False], [True, True]])
    index = torch.tensor([2, 0, 0, 1])
    cache.reorder(index)
    assert cache.batch_size == 4
    torch.testing.assert_close(cache.k_cache[1][:, :, :2], k[index])
    torch.testing.assert_close(cache.cross_v[0], v[index] + 1)
    assert cache.src_pad_mask.tolist() == [[True, True], [False, True], [False, True], [False, False]]
    with pytest.raises(ValueError, match="max_len=5"):
        cache.update(0, torch.randn(4, 2, 4, 4), torch.randn(4, 2, 4, 4))
    # Beams of the same sentences moving: self-attention rows follow, cross-attention state stays.
    cross_before, mask_before = cache.cross_k[1], cache.src_pad_mask
    perm = torch.tensor([1, 0, 3, 2])
    cache.reorder(perm, cross=False)
    torch.testing.assert_close(cache.k_cache[0][:, :, :2], k[index][perm])
    assert cache.cross_k[1] is cross_before and cache.src_pad_mask is mask_before
    with pytest.raises(ValueError, match="must keep the batch size 4"):
        cache.reorder(torch.tensor([0, 1]), cross=False)


def test_positions_beyond_table_raise():
    model = tiny_model(max_positions=8)
    with pytest.raises(ValueError, match="max_positions=8"):
        model.encode(torch.full((1, 9), 5))


def test_model_with_triton_backend_matches_sdpa():
    """Whole model through the kernel (interpreted on CPU): forward and cached decoding."""
    gen = torch.Generator().manual_seed(8)
    sdpa = tiny_model(attention_backend="sdpa")
    tri = tiny_model(attention_backend="triton")
    tri.load_state_dict(sdpa.state_dict())
    src = random_tokens(gen, 2, 7, [7, 3])
    tgt = random_tokens(gen, 2, 5, [5, 5])
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        torch.testing.assert_close(tri(src, tgt), sdpa(src, tgt), atol=1e-4, rtol=0)
        memory, src_pad_mask = tri.encode(src)
        cache = tri.new_kv_cache(2, 5)
        steps = [tri.decode(tgt[:, :1], memory, src_pad_mask, kv_cache=cache)]
        steps += [tri.decode(tgt[:, t : t + 1], None, None, kv_cache=cache) for t in range(1, 5)]
        torch.testing.assert_close(torch.cat(steps, dim=1), sdpa(src, tgt), atol=1e-4, rtol=0)
