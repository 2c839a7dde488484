"""Decode throughput, eager vs. CTranslate2 variants, measured side by side in one process."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["measure", "thread_count"]


class thread_count:
    """Context manager: ``torch.set_num_threads(n)`` inside, the previous value restored after."""

    def __init__(self, n: int) -> None:
        self.n, self.old = n, torch.get_num_threads()

    def __enter__(self) -> None:
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.old)


def measure(decode: Callable[[list[np.ndarray]], list[list[int]]], sources: list[np.ndarray]) -> dict[str, float]:
    """Run ``decode(sources)`` once; ``{seconds, sentences_per_s, tokens_per_s}`` (target tokens, EOS excluded)."""
    t0 = time.perf_counter()
    outs = decode(sources)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o) for o in outs)
    return {"seconds": seconds, "sentences_per_s": len(sources) / seconds, "tokens_per_s": tokens / seconds}
