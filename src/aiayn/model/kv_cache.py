"""Decoder key/value cache for incremental decoding (gpt-fast / torchtune style).

Per decoder layer it holds

- self-attention keys/values of every target token fed so far, in preallocated buffers
  ``k_cache[layer]``, ``v_cache[layer]``: ``(B, n_kv_heads, max_len, head_dim)``, filled up to
  ``length`` (all rows share one length: decoding is synchronous across the batch);
- cross-attention keys/values of the encoder output, ``cross_k[layer]``, ``cross_v[layer]``:
  ``(B, n_kv_heads, S, head_dim)``, computed once per source on the first decode step;

plus the source padding mask ``src_pad_mask`` ``(B, S)`` (True = pad) that goes with them.

A decoder-only model (``ModelConfig.arch='decoder_only'``) has no cross-attention: its ``2 * n_layers``
self-attention layers cache the whole stream, the (left-padded) source prefix first and then the
target tokens. The source length is known only on the first decode call, which makes room for it
(``reserve``) and stores the left-padded ``src_pad_mask``; ``length`` then counts source + target positions.

Beam search and batch shrinking touch the cache through ONE method, ``reorder(index)``,
which selects/reorders/expands rows of every tensor (like fairseq's
``reorder_incremental_state``). The model writes through ``update`` / ``set_cross`` and
moves the write position with ``advance``.

Its size per token is ``cache_bytes_per_token`` (formula); ``KVCache.self_nbytes`` /
``cross_nbytes`` measure the tensors actually held (``benchmarks/perf/kv_cache_economics.py`` checks one against the other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from aiayn.config.schema import ModelConfig

__all__ = ["KVCache", "cache_bytes", "cache_bytes_per_token"]


def cache_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Bytes one token adds to the cache of ONE decoder layer: ``2 * n_kv_heads * head_dim * bytes_per_element``.

    The 2 is keys + values; each is ``(n_kv_heads, head_dim)`` per token (``ModelConfig.kv_heads``:
    ``n_heads`` for the paper's multi-head attention, fewer for grouped-query attention, 1 for
    multi-query attention). The same number holds for a generated (target) token in the
    self-attention cache and for a source token in the cross-attention cache (stored once per
    source). Positions (sinusoidal, learned, rope, alibi) do not enter: rope rotates the cached keys
    in place, alibi adds a bias to the scores. Units: bytes; ``dtype`` is the cache's (float32: 4,
    bfloat16: 2 bytes per element). The per-token cost of keys/values and its reduction by sharing
    K/V heads: Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need"; Ainslie et
    al. 2023, "GQA"; Pope et al. 2022, "Efficiently Scaling Transformer Inference" (KV-cache size
    ``2 * n_layers * batch * length * n_kv_heads * head_dim`` elements).
    """
    return 2 * cfg.kv_heads * cfg.head_dim * dtype.itemsize


def cache_bytes(cfg: ModelConfig, *, batch_size: int, tgt_len: int, src_len: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the keys/values of a full cache: ``layers * batch_size * (tgt_len + src_len) *
    cache_bytes_per_token(cfg, dtype)``. Encoder-decoder: ``layers = n_layers`` decoder layers, each
    with self-attention over ``tgt_len`` target tokens plus cross-attention over ``src_len`` source
    tokens. Decoder-only: ``layers = 2 * n_layers``, each with self-attention over the stream of
    ``src_len + tgt_len`` tokens (twice the encoder-decoder's cache at equal lengths). Excludes the
    ``(batch_size, src_len)`` bool padding mask, which ``KVCache.nbytes`` counts."""
    layers = cfg.n_layers * (2 if cfg.arch == "decoder_only" else 1)
    return layers * batch_size * (tgt_len + src_len) * cache_bytes_per_token(cfg, dtype)


class KVCache:
    """Preallocated self-attention cache plus lazily filled cross-attention cache.

    Args (keyword-only):
        n_layers: decoder layers.
        batch_size: rows ``B`` (sentences x beams).
        n_kv_heads, head_dim: key/value heads and their width.
        max_len: capacity in target tokens (decoder inputs, BOS included); ``reserve`` adds room
            for a decoder-only model's source prefix.
        dtype, device: of the buffers (the model's parameter dtype/device).
    """

    def __init__(
        self,
        *,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if min(n_layers, batch_size, n_kv_heads, head_dim, max_len) < 1:
            raise ValueError(
                f"KVCache sizes must be >= 1, got n_layers={n_layers}, batch_size={batch_size}, "
                f"n_kv_heads={n_kv_heads}, head_dim={head_dim}, max_len={max_len}"
            )
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.max_len = max_len
        self.length = 0  # positions cached so far (target tokens; decoder-only: source prefix + target tokens)
        self.prefix_len = 0  # decoder-only: the source prefix's length S (``reserve``)
        self.k_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v_cache = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.cross_k: list[torch.Tensor | None] = [None] * n_layers
        self.cross_v: list[torch.Tensor | None] = [None] * n_layers
        self.src_pad_mask: torch.Tensor | None = None  # (B, S) True = pad

    @property
    def batch_size(self) -> int:
        return self.k_cache[0].shape[0]

    @property
    def n_layers(self) -> int:
        return len(self.k_cache)

    @property
    def has_cross(self) -> bool:
        """True once the cross-attention keys/values of every layer are stored."""
        return all(k is not None for k in self.cross_k)

    @property
    def self_nbytes(self) -> int:
        """Bytes of the self-attention key/value buffers (at full ``max_len`` capacity, every layer)."""
        return sum(t.numel() * t.element_size() for t in [*self.k_cache, *self.v_cache])

    @property
    def cross_nbytes(self) -> int:
        """Bytes of the cross-attention keys/values stored so far (0 before the first decode step)."""
        return sum(t.numel() * t.element_size() for t in [*self.cross_k, *self.cross_v] if t is not None)

    @property
    def nbytes(self) -> int:
        """Bytes held by all cached tensors (self buffers at full capacity, cross k/v, mask)."""
        tensors = [*self.k_cache, *self.v_cache, *self.cross_k, *self.cross_v, self.src_pad_mask]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new self-attention ``k, v`` ``(B, n_kv_heads, T_new, head_dim)`` at positions
        ``length .. length + T_new - 1`` of ``layer``; return the filled views
        ``(B, n_kv_heads, length + T_new, head_dim)``. ``length`` moves only on ``advance``.

        Raises ``ValueError`` on a batch/shape mismatch or when ``max_len`` would be exceeded.
        """
        k_buf, v_buf = self.k_cache[layer], self.v_cache[layer]
        B, n_kv_heads, T_new, head_dim = k.shape
        if (B, n_kv_heads, head_dim) != (k_buf.shape[0], k_buf.shape[1], k_buf.shape[3]) or v.shape != k.shape:
            raise ValueError(
                f"KVCache layer {layer}: new k {tuple(k.shape)} / v {tuple(v.shape)} do not fit the cache "
                f"{tuple(k_buf.shape)} (B, n_kv_heads, max_len, head_dim)"
            )
        end = self.length + T_new
        if end > self.max_len:
            raise ValueError(f"KVCache full: {self.length} cached + {T_new} new tokens > max_len={self.max_len}")
        k_buf[:, :, self.length : end] = k
        v_buf[:, :, self.length : end] = v
        return k_buf[:, :, :end], v_buf[:, :, :end]

    def reserve(self, prefix_len: int) -> None:
        """Grow the self-attention buffers by ``prefix_len`` positions for a decoder-only model's source
        prefix (its length is known on the first decode call only). Only on an empty cache (nothing
        to copy: the buffers are reallocated); raises ``ValueError`` otherwise."""
        if self.length or self.prefix_len:
            raise ValueError(
                f"KVCache.reserve needs an empty cache, got length={self.length}, prefix_len={self.prefix_len}"
            )
        if prefix_len < 1:
            raise ValueError(f"KVCache.reserve needs prefix_len >= 1, got {prefix_len}")
        B, n_kv_heads, max_len, head_dim = self.k_cache[0].shape
        shape = (B, n_kv_heads, max_len + prefix_len, head_dim)
        ref = self.k_cache[0]
        self.k_cache = [torch.zeros(shape, dtype=ref.dtype, device=ref.device) for _ in self.k_cache]
        self.v_cache = [torch.zeros(shape, dtype=ref.dtype, device=ref.device) for _ in self.v_cache]
        self.max_len = max_len + prefix_len
        self.prefix_len = prefix_len

    def advance(self, n_tokens: int) -> None:
        """Move the write position by ``n_tokens`` (called once per decode step, after all layers)."""
        if self.length + n_tokens > self.max_len:
            raise ValueError(f"KVCache full: {self.length} + {n_tokens} > max_len={self.max_len}")
        self.length += n_tokens

    def set_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the cross-attention ``k, v`` ``(B, n_kv_heads, S, head_dim)`` of ``layer`` (once per source)."""
        if k.shape[0] != self.batch_size:
            raise ValueError(f"KVCache layer {layer}: cross k batch {k.shape[0]} != cache batch {self.batch_size}")
        self.cross_k[layer], self.cross_v[layer] = k, v

    def reorder(self, index: torch.Tensor, *, cross: bool = True) -> None:
        """Keep rows ``index`` ``(B',)`` (long) of every cached tensor, in that order.

        Serves beam reordering (``index`` = source row of each new beam), beam expansion
        (a row repeated ``beam_size`` times) and dropping finished sentences (a subset).
        Only the filled ``length`` positions of the self-attention buffers are copied.
        ``cross=False`` leaves the cross-attention keys/values and ``src_pad_mask`` as they
        are: valid when ``index`` only permutes rows that share a source (beams of one
        sentence), whose cross-attention state is identical — beam search's common step.
        """
        if index.dim() != 1 or index.dtype != torch.long:
            raise ValueError(f"KVCache.reorder needs a 1-D long index, got {index.dtype} {tuple(index.shape)}")
        index = index.to(self.k_cache[0].device)
        if not cross and index.numel() != self.k_cache[0].shape[0]:
            raise ValueError(f"KVCache.reorder(cross=False) must keep the batch size {self.k_cache[0].shape[0]}, got {index.numel()}")
        filled = self.length

        def select_filled(t: torch.Tensor) -> torch.Tensor:
            out = t.new_empty((index.numel(), *t.shape[1:]))  # (B', n_kv_heads, max_len, head_dim)
            out[:, :, :filled] = t[:, :, :filled].index_select(0, index)
            return out

        def select(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, index)

        self.k_cache = [select_filled(t) for t in self.k_cache]  # each (B', n_kv_heads, max_len, head_dim)
        self.v_cache = [select_filled(t) for t in self.v_cache]
        if not cross:
            return
        self.cross_k = [select(t) for t in self.cross_k]  # each (B', n_kv_heads, S, head_dim)
        self.cross_v = [select(t) for t in self.cross_v]
        self.src_pad_mask = select(self.src_pad_mask)  # (B', S)
