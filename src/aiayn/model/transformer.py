"""The encoder-decoder Transformer of Vaswani et al. 2017, "Attention Is All You Need", Section 3.

Readable top to bottom: multi-head attention -> feed-forward -> encoder layer -> decoder layer
-> the model. Defaults reproduce the paper:

- Post-norm residual blocks, ``LayerNorm(x + Dropout(Sublayer(x)))`` (Sec. 3.1, 5.4).
  ``norm='pre'`` gives ``x + Dropout(Sublayer(LayerNorm(x)))`` with a final LayerNorm per stack.
- Multi-head attention (Sec. 3.2.2), ``head_dim = d_model / n_heads``; ``n_kv_heads < n_heads``
  gives grouped-query attention (not in the paper; ``None`` = paper).
- Position-wise FFN ``max(0, x W1 + b1) W2 + b2`` (Sec. 3.3); ``gelu`` and ``swiglu``
  (``(silu(x W1) * x W3) W2``, no biases; Shazeer 2020) are options. SwiGLU has three matrices, so
  its hidden width is ``swiglu_hidden(d_ff)`` = 2/3 of ``d_ff`` rounded to a multiple of 8, which
  keeps the FFN's parameters equal to the ReLU one's (as LLaMA does, Touvron et al. 2023, Sec. 2).
- One embedding matrix shared by source, target and the pre-softmax projection, multiplied by
  ``sqrt(d_model)`` in the embedding layers (Sec. 3.4); the output projection has no bias.
  ``share_embeddings=False`` gives the source its own matrix; the target input embedding and
  the output projection stay tied (fairseq's ``share_decoder_input_output_embed``).
- Sinusoidal positions (Sec. 3.5) and dropout on embeddings + positions and on every sublayer
  output (Sec. 5.4; on CPU ``aiayn.model.dropout``'s mask, a quarter of torch's random draws,
  ``p`` rounded to 1/65536). ``positions``: ``learned`` (a trained table), ``rope`` (rotary queries/keys in
  self-attention) or ``alibi`` (distance bias on self-attention scores) instead; see
  ``aiayn.model.positions``. ``norm_type='rmsnorm'`` replaces every LayerNorm by RMSNorm (Zhang &
  Sennrich 2019, "Root Mean Square Layer Normalization", eq. 4; eps 1e-6 as in LLaMA).

Decoder-only (``arch='decoder_only'``; not in the paper): no encoder and no cross-attention, one stack
of ``2 * n_layers`` causal self-attention + FFN layers (``DecoderOnlyLayer``; the encoder's layers
plus the decoder's, so the parameters are the encoder-decoder's minus its cross-attention blocks)
over the stream ``[source tokens, EOS, BOS, target tokens]``, i.e. ``concat(src, tgt_in)`` of a
training batch; the EOS/BOS pair separates source and target. This is the "Transformer-Decoder
(T-D)" of Liu et al. 2018, "Generating Wikipedia by Summarizing Long Sequences" (ICLR; drop the
encoder, join input and output into one sequence, train as a language model); with causal masking
over the whole stream it is the "language model" architecture that Raffel et al. 2020 (T5, Sec. 3.2)
compare with the encoder-decoder and the prefix LM. ``forward`` returns logits for the target
positions only, so the training loss (``aiayn.train.label_smoothed_cross_entropy`` on ``tgt_out``)
covers the target only (Liu et al. train on the whole stream). Inside the model each source row's
padding moves to the LEFT (the real source ends right before the target; pad keys are masked) and
each row numbers its own positions from its first real token (``position = index - n_pad``), so a
sentence's output does not depend on its batch's padding. ``encode`` embeds the left-padded source
(the stream's prefix); ``decode`` runs the stack over prefix + target, and with a ``KVCache`` the first
call prefills the cache with the source (the cache grows by ``S``, see ``KVCache.reserve``) and later
calls continue each row's positions. Sources and targets share one position range:
``Transformer.max_side_tokens`` (each side's limit) is ``ModelConfig.max_positions // 2``.

Initialisation (not given by the paper; fairseq's convention): xavier-uniform weights and zero
biases for every linear layer, embedding ~ Normal(0, d_model**-0.5) with the PAD row zero, so
that ``embedding * sqrt(d_model)`` has unit variance; LayerNorm gain 1, bias 0.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from aiayn.config.schema import PAD_ID, ModelConfig
from aiayn.model.attention import BACKENDS, AttendFn, logger, select_backend
from aiayn.model.dropout import Dropout
from aiayn.model.kv_cache import KVCache
from aiayn.model.positions import RotaryPositions, additive_positions, alibi_bias, alibi_slopes, check_range

__all__ = [
    "Transformer", "MultiHeadAttention", "FeedForward", "EncoderLayer", "DecoderLayer", "DecoderOnlyLayer", "swiglu_hidden",
]  # fmt: skip


class MultiHeadAttention(nn.Module):
    """Multi-head (grouped-query) attention, paper Sec. 3.2.2, with separate q/k/v/out projections.

    ``project_kv`` and ``forward`` are split so a KV cache can store keys/values between calls.
    """

    def __init__(
        self, *, d_model: int, n_heads: int, n_kv_heads: int, attention_dropout: float, attend: AttendFn,
        rope: RotaryPositions | None = None,
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.attention_dropout = attention_dropout
        self.attend = attend
        self.rope = rope  # rotates queries and keys by position (self-attention only)
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim)
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model)

    def project_kv(self, x: torch.Tensor, start: int | torch.Tensor = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x`` ``(B, T, d_model)`` at positions ``start ..`` (or per-row positions
        ``start`` ``(B, T)`` long): two ``(B, n_kv_heads, T, head_dim)`` (keys rotated when rotary: a
        cache stores them rotated)."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, n_kv_heads, T, head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, n_kv_heads, T, head_dim)
        if self.rope is not None:
            k = self.rope.rotate(k, start)
        return k, v

    def forward(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        key_padding_mask: torch.Tensor | None,
        start: int | torch.Tensor = 0,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend from queries of ``x`` ``(B, Tq, d_model)`` at positions ``start ..`` (or per-row
        positions ``start`` ``(B, Tq)`` long) to ``k, v`` ``(B, n_kv_heads, Tk, head_dim)``.

        Returns ``(B, Tq, d_model)``. ``key_padding_mask`` ``(B, Tk)`` True = pad; ``bias``
        ``(1 or B, n_heads, Tq, Tk)`` an additive score bias (ALiBi, computed once per stack by ``Transformer``).
        """
        B, Tq, _ = x.shape
        q = self.q_proj(x).view(B, Tq, self.n_heads, self.head_dim).transpose(1, 2)  # (B, n_heads, Tq, head_dim)
        if self.rope is not None:
            q = self.rope.rotate(q, start)
        dropout_p = self.attention_dropout if self.training else 0.0
        out = self.attend(q, k, v, causal=causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p, bias=bias)
        out = out.transpose(1, 2).reshape(B, Tq, self.n_heads * self.head_dim)  # (B, Tq, d_model)
        return self.out_proj(out)


def swiglu_hidden(d_ff: int) -> int:
    """SwiGLU hidden width with the parameters of a ``d_ff`` ReLU FFN: ``3 h d ~= 2 d_ff d`` ->
    ``h = 2 d_ff / 3``, rounded to a multiple of 8 (at least 8)."""
    return max(8, 8 * round(2 * d_ff / 3 / 8))


class FeedForward(nn.Module):
    """Position-wise feed-forward network, paper Sec. 3.3: ``(B, T, d_model) -> (B, T, d_model)``."""

    def __init__(self, *, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        if activation not in ("relu", "gelu", "swiglu"):
            raise ValueError(f"unknown activation {activation!r}; choose 'relu', 'gelu' or 'swiglu'")
        self.activation = activation
        swiglu = activation == "swiglu"
        d_ff = swiglu_hidden(d_ff) if swiglu else d_ff
        self.w1 = nn.Linear(d_model, d_ff, bias=not swiglu)
        self.w2 = nn.Linear(d_ff, d_model, bias=not swiglu)
        self.w3 = nn.Linear(d_model, d_ff, bias=False) if swiglu else None  # gate (Shazeer 2020)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w1(x)  # (B, T, d_ff)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        else:
            h = F.silu(h) * self.w3(x)
        return self.w2(h)  # (B, T, d_model)


def _norm(d_model: int, norm_type: str) -> nn.Module:
    """``nn.LayerNorm`` (the paper) or ``nn.RMSNorm`` (eps 1e-6) over the last ``d_model`` features."""
    if norm_type == "layernorm":
        return nn.LayerNorm(d_model)
    if norm_type == "rmsnorm":
        return nn.RMSNorm(d_model, eps=1e-6)
    raise ValueError(f"unknown norm_type {norm_type!r}; choose 'layernorm' or 'rmsnorm'")


class _Residual(nn.Module):
    """One sublayer connection: post-norm ``LN(x + drop(f(x)))`` or pre-norm ``x + drop(f(LN(x)))``."""

    def __init__(self, *, d_model: int, dropout: float, norm: str, norm_type: str = "layernorm") -> None:
        super().__init__()
        self.pre = norm == "pre"
        self.norm = _norm(d_model, norm_type)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        if self.pre:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention + FFN, paper Sec. 3.1 (encoder)."""

    def __init__(self, cfg: ModelConfig, attend: AttendFn, rope: RotaryPositions | None = None) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.kv_heads,
            attention_dropout=cfg.attention_dropout, attend=attend, rope=rope,
        )  # fmt: skip
        self.ffn = FeedForward(d_model=cfg.d_model, d_ff=cfg.d_ff, activation=cfg.activation)
        block = dict(d_model=cfg.d_model, dropout=cfg.dropout, norm=cfg.norm, norm_type=cfg.norm_type)
        self.attn_block = _Residual(**block)
        self.ffn_block = _Residual(**block)

    def forward(self, x: torch.Tensor, src_pad_mask: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` ``(B, S, d_model)``, ``src_pad_mask`` ``(B, S)`` True = pad -> ``(B, S, d_model)``.
        ``bias``: ALiBi score bias ``(1, n_heads, S, S)`` or None."""

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attn.project_kv(h)
            return self.self_attn(h, k, v, causal=False, key_padding_mask=src_pad_mask, bias=bias)

        x = self.attn_block(x, self_attention)
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention + encoder-decoder attention + FFN, paper Sec. 3.1 (decoder)."""

    def __init__(self, cfg: ModelConfig, attend: AttendFn, rope: RotaryPositions | None = None) -> None:
        super().__init__()
        mha = dict(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.kv_heads,
                   attention_dropout=cfg.attention_dropout, attend=attend)  # fmt: skip
        self.self_attn = MultiHeadAttention(**mha, rope=rope)
        self.cross_attn = MultiHeadAttention(**mha)  # no positions: source and target do not align
        self.ffn = FeedForward(d_model=cfg.d_model, d_ff=cfg.d_ff, activation=cfg.activation)
        block = dict(d_model=cfg.d_model, dropout=cfg.dropout, norm=cfg.norm, norm_type=cfg.norm_type)
        self.self_block = _Residual(**block)
        self.cross_block = _Residual(**block)
        self.ffn_block = _Residual(**block)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        src_pad_mask: torch.Tensor,
        *,
        layer_idx: int,
        kv_cache: KVCache | None,
        start: int = 0,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, T, d_model)`` new target positions -> ``(B, T, d_model)``; ``bias``: the
        self-attention's ALiBi score bias ``(1, n_heads, T, start + T)`` or None.

        Without a cache, ``x`` is the whole prefix and self-attention is causal. With a cache,
        the new keys/values are appended to it and the queries see every cached position
        (bottom-right causal mask); the cross-attention keys/values come from the cache when
        stored, else from ``memory`` ``(B, S, d_model)`` (and are stored).
        """
        T = x.shape[1]

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attn.project_kv(h, start)  # (B, n_kv_heads, T, head_dim)
            if kv_cache is not None:
                k, v = kv_cache.update(layer_idx, k, v)  # (B, n_kv_heads, cached + T, head_dim)
            return self.self_attn(h, k, v, causal=T > 1, key_padding_mask=None, start=start, bias=bias)

        def cross_attention(h: torch.Tensor) -> torch.Tensor:
            if kv_cache is not None and kv_cache.cross_k[layer_idx] is not None:
                k, v = kv_cache.cross_k[layer_idx], kv_cache.cross_v[layer_idx]
            else:
                k, v = self.cross_attn.project_kv(memory)  # (B, n_kv_heads, S, head_dim)
                if kv_cache is not None:
                    kv_cache.set_cross(layer_idx, k, v)
            return self.cross_attn(h, k, v, causal=False, key_padding_mask=src_pad_mask)

        x = self.self_block(x, self_attention)
        x = self.cross_block(x, cross_attention)
        return self.ffn_block(x, self.ffn)


class DecoderOnlyLayer(EncoderLayer):
    """Causal self-attention + FFN over the source-then-target stream (``arch='decoder_only'``):
    an ``EncoderLayer`` (same sublayers and parameter names) run with the decoder's causal mask
    and KV cache, no cross-attention."""

    def forward(  # type: ignore[override]  # the stream's positions and cache, not the encoder's
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor,
        *,
        positions: torch.Tensor,
        layer_idx: int,
        kv_cache: KVCache | None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, T, d_model)``: the stream's new positions -> ``(B, T, d_model)``.

        ``positions`` ``(B, T)`` long: each row's position ids (rotary); ``key_padding_mask``
        ``(B, Tk)`` True = pad over every key (cached + new, ``Tk = cached + T``); ``bias``: ALiBi
        ``(B, n_heads, T, Tk)`` or None. Causal, bottom-right aligned: new positions see every cached one.
        """
        T = x.shape[1]

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            k, v = self.self_attn.project_kv(h, positions)  # (B, n_kv_heads, T, head_dim)
            if kv_cache is not None:
                k, v = kv_cache.update(layer_idx, k, v)  # (B, n_kv_heads, cached + T, head_dim)
            return self.self_attn(h, k, v, causal=T > 1, key_padding_mask=key_padding_mask, start=positions, bias=bias)

        x = self.attn_block(x, self_attention)
        return self.ffn_block(x, self.ffn)


def _embedding(vocab_size: int, d_model: int) -> nn.Embedding:
    """Uninitialised ``nn.Embedding`` (``Transformer._init_weights`` fills it; skipping the default
    init also keeps 'meta' construction fast)."""
    weight = torch.empty(vocab_size, d_model)  # (vocab_size, d_model)
    return nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID, _weight=weight)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (paper Sec. 3), or the decoder-only stream model
    (``cfg.arch='decoder_only'``, module docstring), driven by ``ModelConfig``.

    ``device``: where parameters are created (``None``: torch's default device; 'meta' counts
    parameters without memory). The attention backend is chosen once here for that device and
    kept when the module is moved: with ``attention_backend='auto'`` build on the CUDA device
    (``Transformer(cfg, device='cuda')``) to get the Triton kernel, see
    ``aiayn.model.attention.select_backend``. PAD id is ``aiayn.config.schema.PAD_ID``.
    """

    def __init__(self, cfg: ModelConfig, *, device: torch.device | str | None = None) -> None:
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"Transformer needs an aiayn.config.schema.ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.attention_backend, attend = select_backend(cfg.attention_backend, device)
        if cfg.positions == "alibi" and self.attention_backend == "triton":  # the kernel takes no score bias
            self.attention_backend, attend = "sdpa", BACKENDS["sdpa"]
            logger.info("attention backend: sdpa instead of triton (positions='alibi' needs an additive score bias)")
        self.decoder_only = cfg.arch == "decoder_only"
        if self.decoder_only and self.attention_backend == "triton":  # the kernel masks right padding only
            self.attention_backend, attend = "sdpa", BACKENDS["sdpa"]
            logger.info("attention backend: sdpa instead of triton (arch='decoder_only' left-pads the source: "
                        "the kernel takes right padding only, and causal attention with Tq == Tk or Tq == 1)")
        with torch.device(device) if device is not None else contextlib.nullcontext():
            self.tgt_embed = _embedding(cfg.vocab_size, cfg.d_model)
            self.src_embed = self.tgt_embed if cfg.share_embeddings else _embedding(cfg.vocab_size, cfg.d_model)
            # added to the embeddings (sinusoidal, learned), or None (rope, alibi: inside self-attention)
            self.positions = additive_positions(cfg.positions, max_positions=cfg.max_positions, d_model=cfg.d_model)
            rope = RotaryPositions(head_dim=cfg.head_dim, max_positions=cfg.max_positions) if cfg.positions == "rope" else None
            if cfg.positions == "alibi":  # (n_heads,) slopes; the bias is built once per stack in encode/decode
                slopes = alibi_slopes(cfg.n_heads).to(torch.get_default_device())
                self.register_buffer("alibi_slopes", slopes, persistent=False)
            else:
                self.alibi_slopes = None
            self.dropout = Dropout(cfg.dropout)
            pre = cfg.norm == "pre"
            if self.decoder_only:  # one causal stack: the encoder's layers + the decoder's, no cross-attention
                self.encoder_layers = nn.ModuleList()
                self.decoder_layers = nn.ModuleList(DecoderOnlyLayer(cfg, attend, rope) for _ in range(2 * cfg.n_layers))
                self.encoder_norm = nn.Identity()
            else:
                self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, attend, rope) for _ in range(cfg.n_layers))
                self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, attend, rope) for _ in range(cfg.n_layers))
                self.encoder_norm = _norm(cfg.d_model, cfg.norm_type) if pre else nn.Identity()
            self.decoder_norm = _norm(cfg.d_model, cfg.norm_type) if pre else nn.Identity()
        self.embed_scale = math.sqrt(cfg.d_model)
        self._init_weights()

    @property
    def max_side_tokens(self) -> int:
        """Longest source, and longest target, in tokens (``cfg.max_side_tokens``): ``cfg.max_positions``
        (the rows of the position table), or half of it for ``decoder_only`` (source and target share
        one stream, hence one position range)."""
        return self.cfg.max_side_tokens

    def _init_weights(self) -> None:
        if self.tgt_embed.weight.is_meta:
            return  # nothing to fill ('meta' builds count parameters)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in {id(self.tgt_embed): self.tgt_embed, id(self.src_embed): self.src_embed}.values():
            nn.init.normal_(emb.weight, mean=0.0, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()

    def num_parameters(self) -> int:
        """Number of parameters (elements), each shared tensor counted once (the tied embedding once)."""
        return sum(p.numel() for p in self.parameters())

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """``tokens`` ``(B, T)`` -> ``dropout(embedding * sqrt(d_model) + PE)`` ``(B, T, d_model)``
        (no PE for rope/alibi). Raises ``ValueError`` past ``max_positions`` for every variant."""
        check_range(start, tokens.shape[1], self.cfg.max_positions)
        x = embedding(tokens) * self.embed_scale  # (B, T, d_model)
        if self.positions is not None:
            x = x + self.positions(start, tokens.shape[1]).to(x.dtype)  # (T, d_model) broadcast over B
        return self.dropout(x)

    def _alibi(self, start: int, Tq: int, Tk: int) -> torch.Tensor | None:
        """ALiBi score bias ``(1, n_heads, Tq, Tk)`` for queries at ``start .. start + Tq - 1`` and keys
        at ``0 .. Tk - 1`` (None unless ``positions='alibi'``): built once per stack and call, shared
        by every layer's self-attention."""
        if self.alibi_slopes is None:
            return None
        device = self.alibi_slopes.device
        return alibi_bias(self.alibi_slopes, torch.arange(start, start + Tq, device=device), torch.arange(Tk, device=device))

    # ------------------------------------------------------------------ decoder-only stream

    @staticmethod
    def _stream_positions(n_pad: torch.Tensor, start: int, length: int) -> torch.Tensor:
        """Per-row position ids ``(B, length)`` of stream indices ``start .. start + length - 1``:
        ``index - n_pad`` with ``n_pad`` ``(B,)`` the row's left padding; pads get 0 (they are masked)."""
        index = torch.arange(start, start + length, device=n_pad.device)  # (length,)
        return (index[None, :] - n_pad[:, None]).clamp(min=0)  # (B, length)

    def _embed_at(self, embedding: nn.Embedding, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``tokens`` ``(B, T)`` at per-row ``positions`` ``(B, T)`` -> ``dropout(embedding * sqrt(d_model)
        + PE[positions])`` ``(B, T, d_model)`` (no PE for rope/alibi; the caller checks the range)."""
        x = embedding(tokens) * self.embed_scale  # (B, T, d_model)
        if self.positions is not None:
            x = x + self.positions.at(positions).to(x.dtype)  # (B, T, d_model)
        return self.dropout(x)

    def _encode_stream(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder-only ``encode``: the embedded, LEFT-padded source ``(B, S, d_model)`` (the stream's
        prefix; the layers run in ``decode``) and its padding mask ``(B, S)``, True = pad (left)."""
        real = src.ne(PAD_ID)  # (B, S)
        order = torch.argsort(real.to(torch.int8), dim=1, stable=True)  # (B, S): pads first, tokens in order
        src = src.gather(1, order)  # (B, S) left-padded
        src_pad_mask = src.eq(PAD_ID)  # (B, S)
        S = src.shape[1]
        check_range(0, S, self.cfg.max_positions)
        n_pad = src_pad_mask.sum(dim=1)  # (B,)
        return self._embed_at(self.src_embed, src, self._stream_positions(n_pad, 0, S)), src_pad_mask

    def _decode_stream(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor | None,
        src_pad_mask: torch.Tensor | None,
        kv_cache: KVCache | None,
        project: bool = True,
    ) -> torch.Tensor:
        """Decoder-only ``decode``: logits ``(B, T, vocab_size)`` of the target positions ``tgt_in`` ``(B, T)``
        (``project=False``: their final states ``(B, T, d_model)``).

        Without a cache, or on a cache's first call (the prefill: the cache grows by the source length
        ``S`` and keeps ``src_pad_mask``), the stack runs over ``[memory, embedded tgt_in]``
        (``B, S + T``); later cached calls run over the new target tokens only.
        """
        B, T = tgt_in.shape
        prefill = kv_cache is None or kv_cache.src_pad_mask is None
        if prefill:
            if memory is None or src_pad_mask is None:
                raise ValueError("decode needs memory (B, S, d_model) and src_pad_mask (B, S) from encode()")
            if memory.shape[0] != B or src_pad_mask.shape[0] != B or memory.shape[1] != src_pad_mask.shape[1]:
                raise ValueError(
                    f"tgt_in batch {B}, memory {tuple(memory.shape)} and src_pad_mask "
                    f"{tuple(src_pad_mask.shape)} disagree"
                )
        if kv_cache is not None and kv_cache.batch_size != B:
            raise ValueError(f"tgt_in batch {B} != kv_cache batch {kv_cache.batch_size}")
        if not prefill:
            src_pad_mask = kv_cache.src_pad_mask
        S = src_pad_mask.shape[1]
        begin = 0 if prefill else kv_cache.length  # stream index of this call's first position
        first_tgt = S if prefill else begin  # stream index of this call's first target token
        end = first_tgt + T  # keys: stream indices 0 .. end - 1 (cached + new)
        check_range(0, end, self.cfg.max_positions)
        if prefill and kv_cache is not None:
            kv_cache.reserve(S)
            kv_cache.src_pad_mask = src_pad_mask
        n_pad = src_pad_mask.sum(dim=1)  # (B,) left pads of each row
        x = self._embed_at(self.tgt_embed, tgt_in, self._stream_positions(n_pad, first_tgt, T))  # (B, T, d_model)
        if prefill:
            x = torch.cat([memory.to(x.dtype), x], dim=1)  # (B, S + T, d_model)
        positions = self._stream_positions(n_pad, begin, end - begin)  # (B, L) of this call's L positions
        key_padding_mask = torch.cat([src_pad_mask, src_pad_mask.new_zeros(B, end - S)], dim=1)  # (B, end)
        bias = None
        if self.alibi_slopes is not None:  # (B, n_heads, L, end), once per call, shared by every layer
            bias = alibi_bias(self.alibi_slopes, positions, self._stream_positions(n_pad, 0, end))
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, key_padding_mask, positions=positions, layer_idx=i, kv_cache=kv_cache, bias=bias)
        if kv_cache is not None:
            kv_cache.advance(end - begin)
        x = self.decoder_norm(x[:, -T:])  # (B, T, d_model): the target positions only
        return F.linear(x, self.tgt_embed.weight) if project else x  # (B, T, vocab_size) or (B, T, d_model)

    # ------------------------------------------------------------------ encode / decode

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode ``src`` ``(B, S)`` token ids (right-padded with PAD).

        Returns ``memory`` ``(B, S, d_model)`` (rows at pad positions are meaningless) and
        ``src_pad_mask`` ``(B, S)`` bool, True = pad. Decoder-only: ``memory`` is the embedded source
        moved to LEFT padding (the stream's prefix, not yet through any layer) and ``src_pad_mask``
        marks that left padding. Raises ``ValueError`` for a bad shape or S > ``max_positions``.
        """
        if src.dim() != 2 or src.dtype != torch.long:
            raise ValueError(f"encode expects src (B, S) long token ids, got {src.dtype} {tuple(src.shape)}")
        if self.decoder_only:
            return self._encode_stream(src)
        src_pad_mask = src.eq(PAD_ID)  # (B, S)
        x = self._embed(self.src_embed, src, 0)  # (B, S, d_model)
        bias = self._alibi(0, src.shape[1], src.shape[1])  # (1, n_heads, S, S) or None
        for layer in self.encoder_layers:
            x = layer(x, src_pad_mask, bias)
        return self.encoder_norm(x), src_pad_mask

    def new_kv_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """An empty ``KVCache`` for ``batch_size`` rows and up to ``max_len`` target tokens (BOS included).

        ``dtype``/``device`` default to the model's parameters. Decoder-only: one cache per layer of
        the ``2 * n_layers`` stack; the first ``decode`` call adds room for the source prefix.
        """
        ref = self.tgt_embed.weight
        return KVCache(
            n_layers=len(self.decoder_layers), batch_size=batch_size, n_kv_heads=self.cfg.kv_heads,
            head_dim=self.cfg.head_dim, max_len=max_len, dtype=dtype or ref.dtype, device=device or ref.device,
        )  # fmt: skip

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor | None,
        src_pad_mask: torch.Tensor | None,
        *,
        kv_cache: KVCache | None = None,
        project: bool = True,
    ) -> torch.Tensor:
        """Next-token logits ``(B, T, vocab_size)`` for target inputs ``tgt_in`` ``(B, T)``; with
        ``project=False`` the decoder's final states ``(B, T, d_model)`` instead (the training loss
        projects them itself, ``aiayn.train.linear_label_smoothed_cross_entropy``).

        Without ``kv_cache``: ``tgt_in`` is the whole (BOS-first, right-padded) prefix and
        self-attention is causal, so padding after a position never changes its logits.
        With ``kv_cache``: ``tgt_in`` holds only the new tokens (usually ``T == 1``); their
        positions continue from ``kv_cache.length``; their self-attention keys/values are
        appended. On the first call with an empty cache the cross-attention keys/values of
        ``memory`` ``(B, S, d_model)`` and ``src_pad_mask`` ``(B, S)`` are stored; later calls
        use the stored ones (``memory``/``src_pad_mask`` may then be None).

        Decoder-only: the same contract, with ``memory``/``src_pad_mask`` from ``encode`` (the
        left-padded source prefix); the first call with an empty cache prefills it with the source
        (``_decode_stream``).

        Raises ``ValueError`` for a batch mismatch, a missing memory, or positions beyond
        ``max_positions``.
        """
        if tgt_in.dim() != 2 or tgt_in.dtype != torch.long:
            raise ValueError(f"decode expects tgt_in (B, T) long token ids, got {tgt_in.dtype} {tuple(tgt_in.shape)}")
        if self.decoder_only:
            return self._decode_stream(tgt_in, memory, src_pad_mask, kv_cache, project)
        B, T = tgt_in.shape
        start = 0
        needs_memory = kv_cache is None or not kv_cache.has_cross
        if needs_memory and (memory is None or src_pad_mask is None):
            raise ValueError("decode needs memory (B, S, d_model) and src_pad_mask (B, S) from encode()")
        if needs_memory and (memory.shape[0] != B or src_pad_mask.shape[0] != B):
            raise ValueError(
                f"tgt_in batch {B} != memory batch {memory.shape[0]} / src_pad_mask batch {src_pad_mask.shape[0]}"
            )
        if kv_cache is not None:
            if kv_cache.batch_size != B:
                raise ValueError(f"tgt_in batch {B} != kv_cache batch {kv_cache.batch_size}")
            start = kv_cache.length
            if needs_memory:
                kv_cache.src_pad_mask = src_pad_mask
            src_pad_mask = kv_cache.src_pad_mask
        x = self._embed(self.tgt_embed, tgt_in, start)  # (B, T, d_model)
        bias = self._alibi(start, T, start + T)  # (1, n_heads, T, start + T) or None: keys are cached + new
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, memory, src_pad_mask, layer_idx=i, kv_cache=kv_cache, start=start, bias=bias)
        if kv_cache is not None:
            kv_cache.advance(T)
        x = self.decoder_norm(x)  # (B, T, d_model)
        if not project:
            return x
        return F.linear(x, self.tgt_embed.weight)  # (B, T, vocab_size), tied, no bias (Sec. 3.4)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, project: bool = True) -> torch.Tensor:
        """Teacher-forced logits ``(B, T, vocab_size)`` for ``src`` ``(B, S)`` and ``tgt_in`` ``(B, T)``;
        ``project=False``: the decoder's final states ``(B, T, d_model)`` (see ``decode``)."""
        memory, src_pad_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_pad_mask, project=project)
