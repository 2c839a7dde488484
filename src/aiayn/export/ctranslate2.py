"""Our model bundle -> a CTranslate2 ``TransformerSpec`` (a ``ctranslate2.converters.Converter``).

CTranslate2 4.8 has no converter for a custom PyTorch model; this one maps ``aiayn.model.Transformer``
weight by weight (checked to ~1e-6 in log-probabilities by ``tests/test_quantize.py``):

- ``TransformerSpec.from_config((n_layers, n_layers), n_heads, pre_norm=cfg.norm == 'pre',
  activation=RELU|GELU)``; LayerNorm epsilon 1e-5 (``torch.nn.LayerNorm``'s default).
- Post-norm: each sublayer's ``layer_norm`` is our ``_Residual.norm`` (CTranslate2 applies it after
  the residual add when ``pre_norm=False``). Pre-norm: the same, plus ``encoder.layer_norm`` /
  ``decoder.layer_norm`` = our ``encoder_norm`` / ``decoder_norm``.
- Self-attention ``linear[0]`` = fused ``[q; k; v]``, ``linear[1]`` = ``out_proj``; cross-attention
  ``linear[0]`` = q, ``linear[1]`` = fused ``[k; v]``, ``linear[2]`` = ``out_proj``.
- One embedding matrix for the decoder input and ``decoder.projection`` (no bias; also the encoder's
  when ``share_embeddings``), ``scale_embeddings=True`` (x sqrt(d_model)) on both sides.
- OUR sinusoid table is stored explicitly (``position_encodings.encodings``): CTranslate2's own table
  concatenates the sin and cos halves while ours interleaves them, and scores drift by > 1 without
  it. It has ``cfg.max_positions`` rows: every source and target the eager model accepts (sources
  are capped at ``aiayn.inference.translator.Translator.max_source_tokens``, outputs at ``max_positions - 1`` tokens).
- Vocabulary: CTranslate2 looks tokens up by string, so id ``i`` is registered as sentencepiece
  piece ``i`` (ids line up exactly, PAD/UNK/BOS/EOS = 0/1/2/3 included); sources are passed with our
  EOS already appended (``add_source_eos=False``); decoding starts from ``<s>`` (BOS_ID).

Anything else (``arch='decoder_only'`` included) is refused with ``UnsupportedModelError`` naming the
``ModelConfig`` field.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch
from ctranslate2.converters import Converter
from ctranslate2.specs import common_spec, transformer_spec

from aiayn.inference.artifacts import ModelBundle
from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from aiayn.model import Transformer
from aiayn.model.positions import RotaryPositions
from aiayn.tokenizer import Tokenizer

__all__ = ["AiaynConverter", "UnsupportedModelError", "check_supported", "vocabulary"]

#: LayerNorm epsilon of ``torch.nn.LayerNorm`` (our model uses the default).
LAYER_NORM_EPS = 1e-5

_ACTIVATIONS = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}  # GELU = exact (erf)

#: RotaryPositions' base (the Transformer builds it with its default)
ROPE_BASE = inspect.signature(RotaryPositions).parameters["base"].default

#: ModelConfig fields this converter maps (any value); every other field must keep its default.
_MAPPED_FIELDS = {
    "vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "dropout", "attention_dropout",
    "max_positions", "norm", "activation", "share_embeddings", "attention_backend", "n_kv_heads", "positions",
}  # fmt: skip


class UnsupportedModelError(ValueError):
    """The model uses a configuration this converter cannot map; the message names the field."""


def check_supported(cfg: ModelConfig) -> None:
    """Raise ``UnsupportedModelError`` naming the first ``ModelConfig`` field we cannot map."""
    if cfg.arch != "encoder_decoder":
        raise UnsupportedModelError(
            f"ModelConfig.arch={cfg.arch!r} is not supported by the CTranslate2 converter: it maps the "
            "encoder-decoder TransformerSpec only; a decoder-only stream model (source prefix, left-padded "
            "per-row positions, target-only decoding) would need CTranslate2's decoder-only spec and Generator, "
            "not mapped here"
        )
    if cfg.activation not in _ACTIVATIONS:
        raise UnsupportedModelError(
            f"ModelConfig.activation={cfg.activation!r} is not supported by the CTranslate2 converter "
            f"(supported: {sorted(_ACTIVATIONS)}); swiglu's no-bias gated FFN is not mapped yet"
        )
    if cfg.n_kv_heads is not None and cfg.n_kv_heads != cfg.n_heads:
        raise UnsupportedModelError(
            f"ModelConfig.n_kv_heads={cfg.n_kv_heads} (grouped-query attention) is not supported by the "
            "CTranslate2 converter (needs num_heads_kv and a GQA fused-QKV layout; unverified)"
        )
    if cfg.positions not in ("sinusoidal", "learned", "rope"):  # a table added to the embeddings, or rotary
        raise UnsupportedModelError(
            f"ModelConfig.positions={cfg.positions!r} is not supported by the CTranslate2 converter: its "
            "encoder-decoder spec takes a position table added to the embeddings (sinusoidal or learned) or "
            "rotary self-attention (rope); its ALiBi is decoder-only and not mapped here"
        )
    if cfg.norm not in ("post", "pre"):
        raise UnsupportedModelError(f"ModelConfig.norm={cfg.norm!r} is not supported (post or pre)")
    defaults = ModelConfig()
    for field in type(cfg).model_fields:
        if field not in _MAPPED_FIELDS and getattr(cfg, field) != getattr(defaults, field):
            raise UnsupportedModelError(
                f"ModelConfig.{field}={getattr(cfg, field)!r} is not mapped by the CTranslate2 converter "
                f"(only its default {getattr(defaults, field)!r} is); extend aiayn.export.ctranslate2 first"
            )


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """Token strings in id order (CTranslate2 id ``i`` = our id ``i``). Raises ``ValueError`` on duplicates."""
    tokens = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{tokenizer.source}: sentencepiece pieces are not unique; ids cannot be mapped 1:1")
    if any("\n" in t or "\r" in t for t in tokens):
        raise ValueError(f"{tokenizer.source}: a piece contains a newline (CTranslate2 vocabulary is one per line)")
    return tokens


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy().copy()


def _linear(spec, *layers: torch.nn.Linear) -> None:
    """Set ``spec`` to the row-wise concatenation of ``layers`` (one layer: plain copy)."""
    spec.weight = np.concatenate([_np(m.weight) for m in layers], axis=0)
    if all(m.bias is not None for m in layers):
        spec.bias = np.concatenate([_np(m.bias) for m in layers], axis=0)
    elif any(m.bias is not None for m in layers):
        raise UnsupportedModelError("fused projections mix layers with and without bias")


def _norm(spec, ln: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(ln.weight), _np(ln.bias)


def _ffn(spec, ffn) -> None:
    _linear(spec.linear_0, ffn.w1)
    _linear(spec.linear_1, ffn.w2)


class AiaynConverter(Converter):
    """Convert a ``Transformer`` + ``Tokenizer`` pair; ``AiaynConverter.from_bundle(dir)`` for ``artifacts/model``.

    ``convert(output_dir, quantization='int8'|'int16'|'float32'|..., force=True)`` (inherited) writes
    the CTranslate2 model directory. ``weights`` optionally replaces the model's state (e.g.
    fake-quantized copies for the per-layer-type analysis).
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer) -> None:
        check_supported(model.cfg)
        if tokenizer.vocab_size != model.cfg.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} pieces but ModelConfig.vocab_size={model.cfg.vocab_size}")
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def from_bundle(cls, model_dir: str | Path) -> "AiaynConverter":
        bundle = ModelBundle.load(model_dir, device="cpu")
        return cls(bundle.model, bundle.tokenizer)

    def _load(self) -> transformer_spec.TransformerSpec:
        m, cfg = self.model, self.model.cfg
        pre = cfg.norm == "pre"
        # rope: CTranslate2 rotates the self-attention queries and keys, pairs (2i, 2i+1) ("interleave",
        # ours: RotaryPositions), base 10000, never the cross-attention (ours neither)
        rope = cfg.positions == "rope"
        rotary = dict(rotary_dim=cfg.head_dim, rotary_interleave=True, rotary_base=ROPE_BASE) if rope else {}
        act = _ACTIVATIONS[cfg.activation]
        spec = transformer_spec.TransformerSpec(
            transformer_spec.TransformerEncoderSpec(cfg.n_layers, cfg.n_heads, pre_norm=pre, activation=act, **rotary),
            transformer_spec.TransformerDecoderSpec(cfg.n_layers, cfg.n_heads, pre_norm=pre, activation=act, **rotary),
        )
        tokens = vocabulary(self.tokenizer)
        spec.config.layer_norm_epsilon = LAYER_NORM_EPS
        spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = tokens[UNK_ID], tokens[BOS_ID], tokens[EOS_ID]
        spec.config.decoder_start_token = tokens[BOS_ID]
        spec.config.add_source_bos = False
        spec.config.add_source_eos = False  # our sources already end with EOS (Translator.encode)
        assert tokens[PAD_ID] not in (tokens[UNK_ID], tokens[BOS_ID], tokens[EOS_ID])

        tgt_emb = _np(m.tgt_embed.weight)
        src_emb = tgt_emb if m.src_embed is m.tgt_embed else _np(m.src_embed.weight)

        enc, dec = spec.encoder, spec.decoder
        enc.embeddings[0].weight = src_emb
        enc.scale_embeddings = True
        dec.embeddings.weight = tgt_emb
        dec.scale_embeddings = True
        if rotary:  # no table: the encoder spec makes one anyway (only relative positions drop it)
            del enc.position_encodings
        else:
            table = _np(m.positions.table)  # (max_positions, d_model): OUR interleaved sin/cos
            enc.position_encodings.encodings = table
            dec.position_encodings.encodings = table
        dec.projection.weight = tgt_emb  # tied, no bias (paper Sec. 3.4)
        if pre:
            _norm(enc.layer_norm, m.encoder_norm)
            _norm(dec.layer_norm, m.decoder_norm)

        for ls, layer in zip(enc.layer, m.encoder_layers):
            a = layer.self_attn
            _linear(ls.self_attention.linear[0], a.q_proj, a.k_proj, a.v_proj)
            _linear(ls.self_attention.linear[1], a.out_proj)
            _norm(ls.self_attention.layer_norm, layer.attn_block.norm)
            _ffn(ls.ffn, layer.ffn)
            _norm(ls.ffn.layer_norm, layer.ffn_block.norm)
        for ls, layer in zip(dec.layer, m.decoder_layers):
            a, c = layer.self_attn, layer.cross_attn
            _linear(ls.self_attention.linear[0], a.q_proj, a.k_proj, a.v_proj)
            _linear(ls.self_attention.linear[1], a.out_proj)
            _norm(ls.self_attention.layer_norm, layer.self_block.norm)
            _linear(ls.attention.linear[0], c.q_proj)
            _linear(ls.attention.linear[1], c.k_proj, c.v_proj)
            _linear(ls.attention.linear[2], c.out_proj)
            _norm(ls.attention.layer_norm, layer.cross_block.norm)
            _ffn(ls.ffn, layer.ffn)
            _norm(ls.ffn.layer_norm, layer.ffn_block.norm)

        spec.register_source_vocabulary(tokens)
        spec.register_target_vocabulary(tokens)
        return spec
