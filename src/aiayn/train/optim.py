"""The optimizers ``train.optimizer`` names: the paper's Adam, or Muon for the layers' weight matrices.

``adam``: Adam with ``train.adam_betas`` / ``adam_eps`` (paper Section 5.3) over every parameter.

``muon``: Muon (K. Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks";
``torch.optim.Muon``): momentum SGD whose update for a 2-D weight is orthogonalised by 5 Newton-Schulz
iterations, its learning rate matched to AdamW's update RMS (J. Liu et al. 2025, "Muon is Scalable for LLM
Training", Section 2.2: ``lr * 0.2 * sqrt(max(rows, cols))``, ``adjust_lr_fn="match_rms_adamw"``), so the
same schedule drives both. It takes the encoder's and decoder's 2-D weight matrices (attention projections,
feed-forward); the (tied) embeddings, biases and norms stay with Adam, as in both papers.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MuonWithAdam", "build_optimizer", "muon_parameter"]


def muon_parameter(name: str, param: torch.Tensor) -> bool:
    """True for the parameters Muon updates: 2-D weights inside the layers (not embeddings or the output layer)."""
    return param.ndim == 2 and "embed" not in name and "layers." in name


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
        """Muon's step on one CPU thread, then Adam's. Newton-Schulz is ~15 products of 256-512-wide matrices per
        weight, one after another: with the stages' ``OMP_WAIT_POLICY=PASSIVE`` a second thread sleeps and is woken
        for each, and the step cost 0.74x Adam's tokens/s on 2 threads against 0.9x on one (docs/benchmarks.md,
        "Muon"). One thread also makes its sums the same whatever ``train.num_threads`` is."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self.muon.step()
        finally:
            torch.set_num_threads(threads)
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
    muon = torch.optim.Muon(matrices, lr=lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                            adjust_lr_fn="match_rms_adamw")
    return MuonWithAdam(muon, torch.optim.Adam(rest, **adam_kw))
