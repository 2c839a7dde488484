"""The training objective: label-smoothed cross-entropy, and the validation loss measured with it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from aiayn.batching import collate, make_batches
from aiayn.config import PAD_ID
from aiayn.model import Transformer
from aiayn.tokenizer import EncodedSplit

__all__ = ["label_smoothed_cross_entropy", "validation_loss"]


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, label_smoothing: float, ignore_index: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed label-smoothed cross-entropy over non-pad targets.

    Paper Section 5.4 (label smoothing, Szegedy et al. 2016): the target
    distribution is ``(1 - eps) * onehot + eps / V`` (uniform over the whole
    vocabulary, as ``torch.nn.functional.cross_entropy(label_smoothing=eps)``).

    Args:
        logits: ``(..., V)`` unnormalised scores.
        target: ``(...)`` token ids; ``ignore_index`` positions contribute nothing.

    Returns ``(loss_sum, nll_sum, n_tokens)``: the smoothed loss and the plain
    negative log-likelihood summed over non-pad tokens (nats), and their count.
    """
    # at least float32 (bf16/fp16 autocast logits are widened; float64 stays float64)
    flat_logits = logits.reshape(-1, logits.size(-1))  # (N, V)
    flat_logits = flat_logits.to(torch.promote_types(flat_logits.dtype, torch.float32))
    flat_target = target.reshape(-1)  # (N,)
    loss = F.cross_entropy(
        flat_logits, flat_target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="sum"
    )
    nll = F.cross_entropy(flat_logits.detach(), flat_target, ignore_index=ignore_index, reduction="sum")
    return loss, nll, int((flat_target != ignore_index).sum())


@torch.no_grad()
def validation_loss(model: Transformer, split: EncodedSplit, *, max_tokens: int, label_smoothing: float) -> dict[str, float]:
    """Per-token validation loss and NLL (nats) over ``split``, in eval mode, fixed order.

    Returns ``{"valid_loss", "valid_nll", "valid_ppl"}``. Leaves the model in train mode.
    Does not touch any RNG (dropout is off in eval mode).
    """
    model.eval()
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    for indices in make_batches(split.src_lengths, split.tgt_lengths, max_tokens, data_seed=0, epoch=0):
        b = collate(split, indices)
        device = next(model.parameters()).device
        logits = model(b.src.to(device), b.tgt_in.to(device))
        loss, nll, n = label_smoothed_cross_entropy(logits, b.tgt_out.to(device), label_smoothing=label_smoothing)
        loss_sum += float(loss)
        nll_sum += float(nll)
        n_tokens += n
    model.train()
    nll = nll_sum / max(n_tokens, 1)
    return {"valid_loss": loss_sum / max(n_tokens, 1), "valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))}
