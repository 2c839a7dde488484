"""Replay: each epoch of a continued training mixes in pairs of the parent's own training data.

The new domain's pairs and the parent's (the replay pool) are joined into one split (``join_splits``: the new
pairs first, then the pool). Each epoch takes every new pair once and ``replay_count(n_new, share)`` pool pairs,
so pool pairs are ``share`` of the epoch's pairs; which pool pairs is drawn from ``(data_seed, epoch)`` alone
(without repeats while the pool lasts, the pool again in a new order when an epoch wants more), and the epoch's
batches are made from those pairs by ``aiayn.data.batching.make_batches`` with the same ``(data_seed, epoch)``.
So the data order stays a pure function of ``(data_seed, epoch)`` and a resumed run sees the batches an
uninterrupted one would.
"""

from __future__ import annotations

import numpy as np

from aiayn.data.batching import EpochBatchIterator, make_batches
from aiayn.tokenizer import EncodedSplit

__all__ = ["REPLAY_STREAM", "replay_count", "replay_draw", "join_splits", "ReplayBatchIterator"]

#: The third word of the replay draw's seed (``[data_seed, epoch, REPLAY_STREAM]``): a stream of its own, apart
#: from ``make_batches``' ``[data_seed, epoch]``.
REPLAY_STREAM = 0x5245504C  # "REPL"


def replay_count(n_new: int, share: float) -> int:
    """Pool pairs per epoch so that they are ``share`` of the epoch's pairs: ``round(n_new * share / (1 - share))``."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"replay share must be in [0, 1), got {share}")
    return int(round(n_new * share / (1.0 - share)))


def replay_draw(pool: int, count: int, *, data_seed: int, epoch: int) -> np.ndarray:
    """``count`` indices into a pool of ``pool`` pairs for ``epoch``: a seeded permutation of the pool, followed by
    further permutations when ``count`` exceeds ``pool``. Raises ``ValueError`` for an empty pool asked for pairs."""
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    if pool <= 0:
        raise ValueError(f"replay wants {count} pairs an epoch but the replay pool is empty")
    rng = np.random.Generator(np.random.PCG64([int(data_seed), int(epoch), REPLAY_STREAM]))
    rounds = -(-count // pool)
    return np.concatenate([rng.permutation(pool) for _ in range(rounds)])[:count].astype(np.int64)


def join_splits(first: EncodedSplit, second: EncodedSplit) -> EncodedSplit:
    """One split holding ``first``'s pairs (indices ``0..len(first)-1``) then ``second``'s (in memory)."""
    def side(a: np.ndarray, a_off: np.ndarray, b: np.ndarray, b_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.concatenate([np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32)])
        offsets = np.concatenate([np.asarray(a_off, dtype=np.int64), np.asarray(b_off[1:], dtype=np.int64) + a_off[-1]])
        return ids, offsets

    src, src_off = side(first.src_ids, first.src_offsets, second.src_ids, second.src_offsets)
    tgt, tgt_off = side(first.tgt_ids, first.tgt_offsets, second.tgt_ids, second.tgt_offsets)
    return EncodedSplit(src, src_off, tgt, tgt_off)


class ReplayBatchIterator(EpochBatchIterator):
    """``EpochBatchIterator`` over a joined split (``join_splits``: ``n_new`` new pairs, then the pool) whose every
    epoch holds all new pairs and ``replay_count(n_new, share)`` pool pairs drawn by ``replay_draw``. Its state is
    the base class's: the epoch's pairs and batches are recomputed from ``(data_seed, epoch)``."""

    def __init__(self, split: EncodedSplit, *, n_new: int, share: float, max_tokens: int, data_seed: int) -> None:
        super().__init__(split, max_tokens=max_tokens, data_seed=data_seed)
        if not 0 <= n_new <= len(split):
            raise ValueError(f"n_new={n_new} outside the joined split of {len(split)} pairs")
        self.n_new = n_new
        self.per_epoch = replay_count(n_new, share)

    def epoch_pairs(self, epoch: int) -> np.ndarray:
        """Indices (into the joined split) of ``epoch``'s pairs: every new pair, then its pool pairs."""
        drawn = replay_draw(len(self.split) - self.n_new, self.per_epoch, data_seed=self.data_seed, epoch=epoch)
        return np.concatenate([np.arange(self.n_new, dtype=np.int64), self.n_new + drawn])

    def _epoch_batches(self) -> list[np.ndarray]:
        if self._batches is None:
            pairs = self.epoch_pairs(self.epoch)
            batches = make_batches(np.asarray(self.split.src_lengths)[pairs], np.asarray(self.split.tgt_lengths)[pairs],
                                   self.max_tokens, data_seed=self.data_seed, epoch=self.epoch)
            self._batches = [pairs[b] for b in batches]
        return self._batches
