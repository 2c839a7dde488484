"""Our eager PyTorch decoding with explicit batching and device (the reference every variant meets)."""

from __future__ import annotations

import numpy as np
import torch

from aiayn.batching import pad_batch
from aiayn.config import BOS_ID, EOS_ID
from aiayn.decode import beam_search, greedy_decode
from aiayn.model import Transformer
from aiayn.quantize.ct2_translate import sorted_batches
from aiayn.translate import DecodeOptions

__all__ = ["eager_translate_ids", "eager_logprobs"]


@torch.inference_mode()
def eager_translate_ids(
    model: Transformer, sources: list[np.ndarray], options: DecodeOptions, *, batch_size: int | None = None
) -> list[list[int]]:
    """``aiayn.translate.Translator.translate_ids`` with fixed-size batches (``batch_size``) and the
    model's device (torchao variants live on CUDA); ``batch_size=None`` = the same max_tokens batches."""
    device = next(model.parameters()).device
    results: list[list[int]] = [[] for _ in sources]
    for idx in sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens):
        src = pad_batch([sources[i] for i in idx]).to(device)
        if options.beam_size == 1:
            hyps = greedy_decode(model, src, max_len_a=options.max_len_a, max_len_b=options.max_len_b)
        else:
            hyps = beam_search(model, src, beam_size=options.beam_size, len_penalty=options.len_penalty,
                               max_len_a=options.max_len_a, max_len_b=options.max_len_b)
        for i, h in zip(idx, hyps):
            results[i] = list(h)
    return results


@torch.inference_mode()
def eager_logprobs(model: Transformer, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]:
    """Teacher-forced log-probabilities of each target token and the final EOS: ``(len + 1,)`` float64 each."""
    model.eval()
    out = []
    for src, tgt in zip(sources, targets):
        tgt_in = torch.tensor([[BOS_ID, *tgt]])
        logits = model(torch.as_tensor(np.asarray(src, dtype=np.int64))[None], tgt_in)  # (1, T + 1, V)
        lp = torch.log_softmax(logits[0].double(), dim=-1)
        out.append(lp[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS_ID])].numpy())
    return out
