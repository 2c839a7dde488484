"""Length-bucketed batches whose order is a pure function of ``(data_seed, epoch)``.

fairseq's idea (``data/iterators.py``): the iterator's whole state is a tiny
dict ``{"epoch", "iterations_in_epoch", "data_seed"}``. On resume the epoch's
batch list is recomputed from ``(data_seed, epoch)`` and fast-forwarded, so a
run killed mid-epoch continues with exactly the batches it would have seen.

Sequence layout (paper Section 3; fairseq conventions)::

    src     = tokens + [EOS]             (B, S)  right-padded with PAD
    tgt_in  = [BOS] + tokens             (B, T)  right-padded with PAD
    tgt_out = tokens + [EOS]             (B, T)  right-padded with PAD
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID
from aiayn.tokenizer import EncodedSplit

__all__ = ["Batch", "make_batches", "pad_batch", "collate", "EpochBatchIterator"]


@dataclass(frozen=True)
class Batch:
    """One padded batch. Token counts exclude padding."""

    src: torch.Tensor  # (B, S) int64
    tgt_in: torch.Tensor  # (B, T) int64
    tgt_out: torch.Tensor  # (B, T) int64
    indices: np.ndarray  # (B,) positions in the split
    n_src_tokens: int
    n_tgt_tokens: int


def make_batches(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, *, data_seed: int, epoch: int
) -> list[np.ndarray]:
    """Bucket sentence indices into batches of at most ``max_tokens`` padded tokens.

    Args:
        src_lengths, tgt_lengths: ``(n,)`` token counts without EOS/BOS.
        max_tokens: bound on ``batch_size * longest_side`` (tokens, EOS/BOS included).
        data_seed, epoch: the only sources of randomness; same inputs -> same batches.

    Returns the epoch's batches (arrays of indices), in the order they are to be
    used. Pairs are sorted by (target, source) length with random tie-breaking,
    cut greedily into batches, and the batch order is shuffled.

    Raises ``ValueError`` if one pair alone exceeds ``max_tokens``.
    """
    n = len(src_lengths)
    rng = np.random.Generator(np.random.PCG64([int(data_seed), int(epoch)]))
    longest = np.maximum(np.asarray(src_lengths), np.asarray(tgt_lengths)).astype(np.int64) + 1  # + EOS/BOS
    if n and longest.max() > max_tokens:
        i = int(longest.argmax())
        raise ValueError(f"pair {i} has {int(longest[i])} tokens, more than max_tokens={max_tokens}")
    perm = rng.permutation(n)
    order = perm[np.lexsort((np.asarray(src_lengths)[perm], np.asarray(tgt_lengths)[perm]))]
    batches: list[np.ndarray] = []
    start, width = 0, 0
    for pos in range(n):
        width_new = max(width, int(longest[order[pos]]))
        if (pos - start + 1) * width_new > max_tokens:
            batches.append(order[start:pos])
            start, width_new = pos, int(longest[order[pos]])
        width = width_new
    if start < n:
        batches.append(order[start:n])
    return [batches[i] for i in rng.permutation(len(batches))]


def pad_batch(rows: list[np.ndarray]) -> torch.Tensor:
    """Right-pad 1-D id arrays with PAD into one ``(B, max_len)`` int64 tensor."""
    out = np.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out)


def collate(split: EncodedSplit, indices: np.ndarray) -> Batch:
    """Build the padded ``Batch`` for ``indices`` of ``split`` (layout in the module docstring)."""
    eos, bos = np.array([EOS_ID]), np.array([BOS_ID])
    srcs = [np.concatenate([split.src(int(i)), eos]) for i in indices]
    tgts = [np.asarray(split.tgt(int(i))) for i in indices]
    return Batch(
        src=pad_batch(srcs),
        tgt_in=pad_batch([np.concatenate([bos, t]) for t in tgts]),
        tgt_out=pad_batch([np.concatenate([t, eos]) for t in tgts]),
        indices=np.asarray(indices),
        n_src_tokens=sum(len(s) for s in srcs),
        n_tgt_tokens=sum(len(t) + 1 for t in tgts),
    )


class EpochBatchIterator:
    """Endless, resumable stream of training batches over epochs 1, 2, ...

    State (``state_dict``): ``{"epoch": int, "iterations_in_epoch": int, "data_seed": int}``
    — the next batch is batch ``iterations_in_epoch`` of epoch ``epoch``.
    """

    def __init__(self, split: EncodedSplit, *, max_tokens: int, data_seed: int) -> None:
        self.split = split
        self.max_tokens = max_tokens
        self.data_seed = data_seed
        self.epoch = 1
        self.iterations_in_epoch = 0
        self._batches: list[np.ndarray] | None = None

    def _epoch_batches(self) -> list[np.ndarray]:
        if self._batches is None:
            self._batches = make_batches(
                self.split.src_lengths, self.split.tgt_lengths, self.max_tokens, data_seed=self.data_seed, epoch=self.epoch
            )
        return self._batches

    @property
    def batches_in_epoch(self) -> int:
        return len(self._epoch_batches())

    def next_indices(self) -> np.ndarray:
        """Advance past the next batch and return its sentence indices (no collation).

        Distributed training walks the one global sequence on every rank and collates
        only its own shard (``aiayn.train``), so the order never depends on the world size.
        """
        batches = self._epoch_batches()
        if self.iterations_in_epoch >= len(batches):
            self.epoch += 1
            self.iterations_in_epoch = 0
            self._batches = None
            batches = self._epoch_batches()
        indices = batches[self.iterations_in_epoch]
        self.iterations_in_epoch += 1
        return indices

    def next_batch(self) -> Batch:
        """Return the next batch, moving to the next epoch when this one is used up."""
        return collate(self.split, self.next_indices())

    def n_tgt_tokens(self, indices: np.ndarray) -> int:
        """Target tokens of the batch ``indices`` (EOS included, padding excluded) = ``collate(...).n_tgt_tokens``."""
        return int(np.asarray(self.split.tgt_lengths)[indices].sum()) + len(indices)

    @property
    def end_of_epoch(self) -> bool:
        return self.iterations_in_epoch >= len(self._epoch_batches())

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "iterations_in_epoch": self.iterations_in_epoch, "data_seed": self.data_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position. Raises ``ValueError`` if the state's data_seed differs."""
        if int(state["data_seed"]) != self.data_seed:
            raise ValueError(f"iterator state has data_seed={state['data_seed']}, this run has {self.data_seed}")
        self.epoch = int(state["epoch"])
        self.iterations_in_epoch = int(state["iterations_in_epoch"])
        self._batches = None
