"""The optimizers ``train.optimizer`` names: the paper's Adam, or Muon for the layers' weight matrices.

``adam``: Adam with ``train.adam_betas`` / ``adam_eps`` (paper Section 5.3) over every parameter.

``muon``: Muon (K. Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks"):
momentum SGD whose update for a 2-D weight is orthogonalised by 5 Newton-Schulz iterations, its learning
rate matched to AdamW's update RMS (J. Liu et al. 2025, "Muon is Scalable for LLM Training", Section 2.2:
``lr * 0.2 * sqrt(max(rows, cols))``), so the same schedule drives both. It takes the encoder's and
decoder's 2-D weight matrices (attention projections, feed-forward); the (tied) embeddings, biases and
norms stay with Adam, as in both papers.

``FP32Muon`` is ``torch.optim.Muon`` (same hyperparameters, ``param_groups`` and ``momentum_buffer`` state)
with its Newton-Schulz products in fp32 and batched per shape. ``torch.optim.Muon`` runs them in bf16, which
on a CPU goes to oneDNN's kernel for the ISA at hand: AMX, AVX-512 BF16 and plain AVX-512 give three different
results (three different trained models), and without AMX it costs 4-12x more (docs/studies/muon.md,
"Arithmetic"). fp32 products go through MKL like the rest of the step, which the stages hold to one kernel
(``MKL_CBWR``, aiayn.config.settings), so a Muon run trains the same bytes on every host an Adam one does.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["FP32Muon", "MuonWithAdam", "build_optimizer", "muon_parameter", "orthogonalize"]

#: Newton-Schulz's quintic (a, b, c), Jordan et al. 2024 (``torch.optim.Muon``'s defaults).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def muon_parameter(name: str, param: torch.Tensor) -> bool:
    """True for the parameters Muon updates: 2-D weights inside the layers (not embeddings or the output layer)."""
    return param.ndim == 2 and "layers." in name


def orthogonalize(updates: list[torch.Tensor], *, steps: int = 5, eps: float = 1e-7,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS) -> list[torch.Tensor]:
    """Newton-Schulz's approximate ``U V^T`` of each ``(rows, cols)`` matrix in ``updates`` (Jordan et al. 2024,
    Muon), in fp32: each is scaled to Frobenius norm 1, then ``X <- a X + (b A + c A^2) X`` with ``A = X X^T``,
    ``steps`` times, on the wide orientation (a tall matrix is transposed and back). Matrices of one shape go
    through ``torch.bmm`` together, which on a CPU hands each thread whole matrices: the main job's model (6 or
    more matrices a shape) gets the same bytes on 1 and 2 threads (measured), while a matrix alone is split over
    the threads and its sums change with their number. Returns new fp32 tensors, the inputs' shapes, in order."""
    a, b, c = coefficients
    groups: dict[tuple[int, int], list[int]] = {}
    for i, u in enumerate(updates):
        groups.setdefault((min(u.shape), max(u.shape)), []).append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(updates)
    for indices in groups.values():
        x = torch.stack([updates[i].float() if updates[i].size(0) <= updates[i].size(1) else updates[i].float().T
                         for i in indices])  # (n, rows <= cols)
        x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = torch.bmm(x, x.mT)  # (n, rows, rows)
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        for i, xi in zip(indices, x):
            out[i] = xi if updates[i].size(0) <= updates[i].size(1) else xi.T
    return out


class FP32Muon(torch.optim.Muon):
    """``torch.optim.Muon`` with its Newton-Schulz products in fp32, batched per shape (module doc): the same
    momentum (``lerp``, Nesterov by default), weight decay and lr adjustment (``adjust_lr_fn``: ``"original"``,
    ``sqrt(max(1, rows/cols))``; ``"match_rms_adamw"``, ``0.2 sqrt(max(rows, cols))``), the same state."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            updates = []
            for p in params:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"].lerp_(p.grad, 1 - momentum)
                updates.append(p.grad.lerp(buf, momentum) if group["nesterov"] else buf)
            for p, o in zip(params, orthogonalize(updates, steps=group["ns_steps"], eps=group["eps"],
                                                  coefficients=group["ns_coefficients"])):
                p.mul_(1 - lr * decay)
                p.add_(o, alpha=-lr * _lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


def _lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """Muon's per-matrix lr factor, as ``torch.optim.Muon`` computes it."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


class MuonWithAdam:
    """Muon over the layers' matrices and Adam over the rest, driven as one optimizer.

    It has what the trainer asks of a ``torch.optim.Optimizer``: ``param_groups`` (Muon's, then Adam's; the
    trainer sets ``lr`` in each), ``zero_grad``, ``step``, ``state_dict`` / ``load_state_dict`` and
    ``defaults["fused"]`` (Adam's kernel).
    """

    def __init__(self, muon: torch.optim.Optimizer, adam: torch.optim.Optimizer) -> None:
        self.muon, self.adam = muon, adam
        self.defaults = {"fused": adam.defaults.get("fused")}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [*self.muon.param_groups, *self.adam.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adam.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Muon's step, then Adam's."""
        self.muon.step()
        self.adam.step()

    def state_dict(self) -> dict[str, Any]:
        """One ``{"state", "param_groups"}`` dict as a single optimizer writes it (the checkpoint's format):
        Muon's parameters numbered first, then Adam's; the first ``len(muon.param_groups)`` groups are Muon's."""
        muon, adam = self.muon.state_dict(), self.adam.state_dict()
        offset = sum(len(g["params"]) for g in muon["param_groups"])
        return {
            "state": {**muon["state"], **{offset + int(i): v for i, v in adam["state"].items()}},
            "param_groups": [*muon["param_groups"],
                             *({**g, "params": [offset + i for i in g["params"]]} for g in adam["param_groups"])],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of ``state_dict``. Raises ``ValueError`` for a state of another optimizer's groups (Adam's)."""
        n_groups = len(self.muon.param_groups)
        groups = state["param_groups"]
        if len(groups) != n_groups + len(self.adam.param_groups) or any("betas" in g for g in groups[:n_groups]):
            raise ValueError("the optimizer state is not a Muon + Adam state (a checkpoint of another optimizer)")
        muon_ids = {i for g in groups[:n_groups] for i in g["params"]}
        offset = len(muon_ids)
        per = {int(i): v for i, v in state["state"].items()}
        self.muon.load_state_dict({"state": {i: v for i, v in per.items() if i in muon_ids},
                                   "param_groups": groups[:n_groups]})
        self.adam.load_state_dict({
            "state": {i - offset: v for i, v in per.items() if i not in muon_ids},
            "param_groups": [{**g, "params": [i - offset for i in g["params"]]} for g in groups[n_groups:]],
        })


def build_optimizer(model: torch.nn.Module, cfg: Any, *, lr: float, fused: bool) -> Any:
    """The optimizer ``cfg.optimizer`` names over ``model``'s parameters (``cfg``: a ``TrainConfig``).

    Raises ``ValueError`` for ``muon`` with a model that has no 2-D layer weights.
    """
    adam_kw = dict(lr=lr, betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay, fused=fused)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), **adam_kw)
    named = list(model.named_parameters())
    matrices = [p for n, p in named if muon_parameter(n, p)]
    if not matrices:
        raise ValueError("train.optimizer muon: the model has no 2-D layer weights")
    rest = [p for n, p in named if not muon_parameter(n, p)]
    muon = FP32Muon(matrices, lr=lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                    adjust_lr_fn="match_rms_adamw")
    return MuonWithAdam(muon, torch.optim.Adam(rest, **adam_kw))
