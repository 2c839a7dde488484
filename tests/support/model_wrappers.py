"""Test doubles around a real model (imported by the test modules; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import torch


class LogitBias(torch.nn.Module):
    """Wraps a ``Transformer`` for decoding: adds ``bias[token]`` to that token's logit at every step and
    records the batch size of every ``decode`` call (``batch_sizes``).

    ``LogitBias(model, {EOS_ID: -1e4})`` never ends a hypothesis; ``LogitBias(model, {UNK_ID: 1e4})``
    makes UNK win every argmax and beam slot.
    """

    def __init__(self, inner: torch.nn.Module, bias: dict[int, float] | None = None) -> None:
        super().__init__()
        self.inner, self.bias, self.batch_sizes = inner, dict(bias or {}), []
        self.max_side_tokens = inner.max_side_tokens

    def encode(self, src):
        return self.inner.encode(src)

    def new_kv_cache(self, batch_size, max_len):
        return self.inner.new_kv_cache(batch_size, max_len)

    def decode(self, tgt_in, memory, src_pad_mask, *, kv_cache=None):
        self.batch_sizes.append(tgt_in.shape[0])
        logits = self.inner.decode(tgt_in, memory, src_pad_mask, kv_cache=kv_cache).clone()
        for token, value in self.bias.items():
            logits[..., token] += value
        return logits
