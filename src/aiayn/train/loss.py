"""The training objective: label-smoothed cross-entropy, and the validation loss measured with it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from aiayn.data.batching import collate, make_batches
from aiayn.config.schema import PAD_ID
from aiayn.model import Transformer
from aiayn.tokenizer import EncodedSplit

__all__ = ["label_smoothed_cross_entropy", "linear_label_smoothed_cross_entropy", "validation_loss"]


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


class _LinearLabelSmoothedCE(torch.autograd.Function):
    """Output projection + label-smoothed cross-entropy, chunk by chunk, gradients made in the forward pass.

    For each chunk of ``chunk_tokens`` target positions: logits ``(n, V)``, their log-sum-exp, the loss and
    its gradient ``softmax - (1 - eps) * onehot - eps / V``; then ``grad_hidden = g @ W`` and
    ``grad_weight += g^T @ h``. The ``(N, V)`` logits never exist whole (2048 tokens x 8000 pieces x 4 bytes
    = 65 MB; a chunk of 512 is 16 MB). The backward only
    scales the stored gradients by the incoming scalar (the objective is linear in them).
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, label_smoothing, chunk_tokens):  # type: ignore[override]
        eps, V = label_smoothing, weight.shape[0]
        grad_hidden = torch.zeros_like(hidden)  # (N, d); pad rows stay 0
        grad_weight = torch.zeros_like(weight)  # (V, d)
        loss = hidden.new_zeros((), dtype=torch.float64)
        nll = hidden.new_zeros((), dtype=torch.float64)
        rows = (target != PAD_ID).nonzero().squeeze(1)  # (M,) the non-pad positions
        for start in range(0, rows.numel(), chunk_tokens):
            idx = rows[start : start + chunk_tokens]
            h, t = hidden.index_select(0, idx), target.index_select(0, idx).unsqueeze(1)  # (n, d), (n, 1)
            logits = h @ weight.T  # (n, V)
            lse = torch.logsumexp(logits, dim=1)  # (n,)
            nll_tok = lse - logits.gather(1, t).squeeze(1)  # -log p(target)
            smooth_tok = lse - logits.mean(dim=1)  # -mean_v log p(v)
            nll += nll_tok.sum(dtype=torch.float64)
            loss += ((1.0 - eps) * nll_tok + eps * smooth_tok).sum(dtype=torch.float64)
            g = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place: (n, V)
            if eps:
                g.sub_(eps / V)
            g.scatter_add_(1, t, g.new_full(t.shape, -(1.0 - eps)))
            grad_hidden.index_copy_(0, idx, g @ weight)
            grad_weight.addmm_(g.T, h)
        ctx.save_for_backward(grad_hidden, grad_weight)
        loss, nll = loss.to(hidden.dtype), nll.to(hidden.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None


def linear_label_smoothed_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, label_smoothing: float, chunk_tokens: int = 512
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``label_smoothed_cross_entropy(hidden @ weight.T, target)`` without the ``(B, T, V)`` logits.

    The same objective (paper Section 5.4; the output layer of Section 3.4), computed over
    ``chunk_tokens`` non-pad target positions at a time with its gradient made on the spot
    (``_LinearLabelSmoothedCE``): memory for one chunk's logits instead of the batch's; on the main job's
    CPU step it measured 1.04x, within the spread (docs/studies/job-sizing.md, "A smaller output layer").
    Equal to the plain path to float32 rounding, not bit for bit (another summation order).

    Args:
        hidden: ``(..., d_model)`` the decoder's final states (``Transformer.forward(..., project=False)``).
        weight: ``(V, d_model)`` the output projection (the tied target embedding).
        target: ``(...)`` token ids; ``PAD_ID`` positions contribute nothing.

    Returns ``(loss_sum, nll_sum, n_tokens)`` as ``label_smoothed_cross_entropy``. Raises ``ValueError``
    unless ``hidden`` and ``weight`` are both float32 or both float64 (autocast runs use the plain path),
    or for ``chunk_tokens`` < 1.
    """
    if hidden.dtype not in (torch.float32, torch.float64) or weight.dtype != hidden.dtype:
        raise ValueError(f"the chunked loss runs in float32 or float64, got hidden {hidden.dtype}, weight {weight.dtype}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    flat_hidden = hidden.reshape(-1, hidden.size(-1))  # (N, d)
    flat_target = target.reshape(-1)  # (N,)
    loss, nll = _LinearLabelSmoothedCE.apply(flat_hidden, weight, flat_target, label_smoothing, chunk_tokens)
    return loss, nll, int((flat_target != PAD_ID).sum())


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
