"""The quality gate and output sanity checks shared by the stage, the benchmark and the tests."""

from __future__ import annotations

__all__ = ["gate", "max_run", "degenerate_lines", "ACCEPTED", "REJECTED", "SKIPPED", "FAILED"]

ACCEPTED, REJECTED, SKIPPED, FAILED = "accepted", "rejected", "skipped", "failed"


def gate(bleu_delta: float, max_bleu_drop: float) -> str:
    """``rejected`` when the variant lost more than ``max_bleu_drop`` BLEU against the eager float model."""
    return REJECTED if bleu_delta < -max_bleu_drop else ACCEPTED


def max_run(tokens: list[int]) -> int:
    """Longest run of one repeated token (0 for an empty list)."""
    best = run = 0
    prev = None
    for t in tokens:
        run = run + 1 if t == prev else 1
        prev = t
        best = max(best, run)
    return best


def degenerate_lines(outputs: list[list[int]], reference: list[list[int]], *, max_repeat: int = 4) -> list[int]:
    """0-based lines where ``outputs`` is empty or repeats one token more than ``max_repeat`` times in a
    row while ``reference`` (the float model's output of the same line) does not."""
    bad = []
    for i, (o, r) in enumerate(zip(outputs, reference)):
        if (not o and r) or (max_run(o) > max_repeat and max_run(r) <= max_repeat):
            bad.append(i)
    return bad
