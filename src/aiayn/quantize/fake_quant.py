"""CTranslate2's int8 weight scheme in PyTorch, to measure where the int8 BLEU loss comes from.

``ctranslate2.specs.model_spec.LayerSpec._quantize`` (int8): per output row,
``scale = 127 / max|w_row|`` (an all-zero row gets scale 1), ``q = rint(w * scale)`` in int8,
dequantized as ``q / scale``. ``fake_quantize_int8`` returns that round trip in float32, so a
model can be evaluated with exactly the weights CTranslate2 would store, one layer type at a time.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from aiayn.model import Transformer

__all__ = ["fake_quantize_int8", "LAYER_TYPES", "layer_type_weights", "with_fake_int8"]


def fake_quantize_int8(w: torch.Tensor) -> torch.Tensor:
    """Per-row symmetric int8 round trip of a 2-D weight ``(out, in)`` (CTranslate2's scheme), float32."""
    w32 = w.detach().to(torch.float32)
    amax = w32.abs().amax(dim=1)  # (out,)
    amax = torch.where(amax == 0, torch.full_like(amax, 127.0), amax)
    scale = 127.0 / amax  # (out,)
    q = torch.round(w32 * scale[:, None]).clamp(-128, 127)  # rint: round half to even, like numpy
    return q / scale[:, None]


#: Layer types, as the per-type attribution groups them (each a predicate on a module path).
LAYER_TYPES = (
    "embedding+projection",  # tied: CTranslate2 quantizes the embedding and the projection reuses it
    "encoder.self_attn",
    "encoder.ffn",
    "decoder.self_attn",
    "decoder.cross_attn",
    "decoder.ffn",
)


def layer_type_weights(model: Transformer, layer_type: str) -> list[nn.Parameter]:
    """The 2-D weights (one per Linear / embedding) that belong to ``layer_type``."""
    if layer_type not in LAYER_TYPES:
        raise ValueError(f"unknown layer type {layer_type!r}; choose from {LAYER_TYPES}")
    if layer_type == "embedding+projection":
        return list({id(e.weight): e.weight for e in (model.src_embed, model.tgt_embed)}.values())
    side, block = layer_type.split(".")
    layers = model.encoder_layers if side == "encoder" else model.decoder_layers
    out = []
    for layer in layers:
        for m in getattr(layer, block).modules():
            if isinstance(m, nn.Linear):
                out.append(m.weight)
    return out


def with_fake_int8(model: Transformer, layer_types: tuple[str, ...]) -> Transformer:
    """A deep copy of ``model`` whose ``layer_types`` weights went through the int8 round trip."""
    copy_ = copy.deepcopy(model).eval()
    with torch.no_grad():
        for lt in layer_types:
            for w in layer_type_weights(copy_, lt):
                w.copy_(fake_quantize_int8(w))
    return copy_
