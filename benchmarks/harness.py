"""What the benchmarks share: the repository root, the host line, alternating rounds and their spread, Markdown tables.

- ``host_line()``: the machine a timing came from (``aiayn.host``: CPU, cores, ISA, 2-thread fp32 matmul GFLOP/s),
  printed beside every table (``docs/results.md`` says how to read it);
- ``alternate(runs, rounds)``: every side once per round, the order reversed every other round (A B, B A, A B, ...;
  ``rotate=True``: A B C, B C A, C A B, ...), so drift in the host's speed hits every side alike; ``round_order``
  gives one round's order to loops that cannot be written as one callable per side;
- ``Spread.of(values)``: median and min-max of the rounds, formatted ``median (min-max)``; ``ratios(a, b)``: the
  per-round ratios of two sides (their spread is the honest one: both sides of a round saw the same host);
- ``markdown_table(header, rows, align)``: a table as the docs print it; ``markdown_row(cells)``: one more row, for
  scripts that print each row as soon as it is measured (``markdown_table(header, [])`` is the head alone).

Importing this module imports neither torch nor ``aiayn`` (some scripts import torch first on purpose).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = ["REPO", "Spread", "alternate", "host_line", "markdown_row", "markdown_table", "ratios", "round_order"]

#: The repository root (this file is ``<root>/benchmarks/harness.py``).
REPO = Path(__file__).resolve().parents[1]

T = TypeVar("T")


def host_line(*, probe: bool = True) -> str:
    """``host: <cpu>, <cores> cores, ISA <flags>, 2-thread fp32 matmul <x> GFLOP/s`` (``probe=False``: no matmul,
    0 GFLOP/s; ``aiayn.host``)."""
    from aiayn.host import host_info

    return host_info(probe=probe).line()


def round_order(names: Sequence[T], round_index: int, *, rotate: bool = False) -> list[T]:
    """The order of ``names`` in round ``round_index`` (0-based): as given in even rounds and reversed in odd ones,
    or (``rotate``) shifted by one place each round."""
    names = list(names)
    if rotate:
        k = round_index % len(names) if names else 0
        return names[k:] + names[:k]
    return names if round_index % 2 == 0 else names[::-1]


def alternate(runs: Mapping[str, Callable[[], T]], rounds: int, *, rotate: bool = False,
              progress: Callable[[int, str, T], None] | None = None) -> dict[str, list[T]]:
    """``{name: [result of each round]}``: every callable of ``runs`` once per round, in ``round_order``;
    ``progress(round, name, result)`` after each call (e.g. a line on stderr)."""
    out: dict[str, list[T]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in round_order(list(runs), r, rotate=rotate):
            out[name].append(result := runs[name]())
            if progress is not None:
                progress(r, name, result)
    return out


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios ``a[i] / b[i]``."""
    return [x / y for x, y in zip(a, b)]


@dataclass(frozen=True)
class Spread:
    """Median and min-max of a few rounds. ``f"{s:.2f}"`` gives ``median (min-max)``; ``s.width`` is max - min."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = list(values)
        return cls(statistics.median(values), min(values), max(values))

    @property
    def width(self) -> float:
        return self.high - self.low

    def __format__(self, spec: str) -> str:
        return f"{self.median:{spec}} ({self.low:{spec}}-{self.high:{spec}})"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A Markdown table: ``header``, then one line per row (cells as ``str()`` gives them). ``align``: one letter per
    column, ``l`` (``---``) or ``r`` (``---:``); default all ``l``."""
    align = align or "l" * len(header)
    if len(align) != len(header):
        raise ValueError(f"align {align!r} has {len(align)} columns, the header {len(header)}")
    lines = [markdown_row(header), "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
    lines += [markdown_row(row) for row in rows]
    return "\n".join(lines)


def markdown_row(cells: Sequence[object]) -> str:
    """``| a | b |``: one table row (cells as ``str()`` gives them)."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"
