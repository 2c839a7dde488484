"""The input rules of translation: text lines in, one output line per input line, any decoder.

``Translator(tokenizer, decoder)`` puts these rules in front of a ``aiayn.inference.runtimes.Decoder`` (eager
PyTorch or CTranslate2); ``Translator.prepare`` + ``Translator.translate_prepared`` (or
``Translator.translate``, both in one) is the one translation path: ``aiayn translate``, the
``evaluate`` stage, the service and the MLflow pyfunc model call it. Per input line
(``aiayn.inference.text`` decides what a line is):

- blank or whitespace-only -> an empty output line, without decoding; N lines in -> N lines out;
- line-break and control characters inside a line -> spaces (``aiayn.inference.text.clean_line``);
- characters the tokenizer does not know (emoji, rare scripts: sentencepiece's unknown piece) are
  dropped from the source (the model never saw the unknown piece in training), counted, and one
  warning says how many lines had them; the unknown piece is never generated, and no output
  contains sentencepiece's placeholder U+2047;
- a line longer than the model accepts (``Translator.max_source_tokens``: the source and the
  decoder's length cap must both fit the model's per-side limit ``max_side_tokens``) follows the
  ``long`` policy: ``"error"`` (``InputError`` naming the line and its length), ``"truncate"`` (cut,
  one warning per line) or ``"split"`` (translated in pieces cut at sentence, clause, then word
  boundaries and joined with spaces).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from aiayn.inference.artifacts import ModelBundle
from aiayn.config.schema import EOS_ID, UNK_ID
from aiayn.inference.search import Hypothesis, length_penalty
from aiayn.inference.runtimes import DecodeOptions, Decoder, EagerDecoder
from aiayn.inference.text import LONG_POLICIES, InputError, clean_line, output_line, split_long
from aiayn.tokenizer import Tokenizer

__all__ = ["Translator", "max_source_tokens", "PreparedInput", "InputReport", "ScoredLine", "InputError", "LONG_POLICIES"]

log = logging.getLogger("aiayn")


@dataclass
class InputReport:
    """What ``Translator.prepare`` found in its input; counts are input lines.

    ``limit``: longest source accepted, in tokens with EOS. ``unknown_chars``: each character (or
    run of them) the tokenizer does not know, with its number of occurrences. ``long_lines``:
    ``(line, tokens with EOS)`` of every line over ``limit`` (split or truncated).
    """

    lines: int = 0
    blank: int = 0
    limit: int = 0
    unknown_lines: int = 0
    unknown_chars: Counter = field(default_factory=Counter)
    long_lines: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class ScoredLine:
    """One hypothesis of an input line: its text and ``score``, the length-normalised log-probability
    ``log P(Y | X) / ((5 + |Y|) / 6) ** len_penalty`` (natural log; ``|Y|`` counts tokens with EOS;
    ``aiayn.inference.search``); ``0.0`` for a blank line (nothing to translate)."""

    text: str
    score: float


@dataclass
class PreparedInput:
    """Input lines as decoder units. ``units``: ``(len,)`` int64 source ids with EOS, at most
    ``report.limit`` long; ``spans[i] = (start, end)``: the units of line ``i`` (``start == end`` for
    a line with nothing to translate)."""

    units: list[np.ndarray]
    spans: list[tuple[int, int]]
    report: InputReport


def max_source_tokens(max_side_tokens: int, options: DecodeOptions = DecodeOptions()) -> int:
    """Longest source a model with the per-side limit ``max_side_tokens`` (``ModelConfig.max_side_tokens``)
    translates without clipping, in tokens with EOS.

    The largest ``n <= max_side_tokens`` with ``int(max_len_a * n + max_len_b) <= max_side_tokens - 1``
    (the decoder's output cap, BOS included, must fit too; ``aiayn.inference.search``). Raises ``ValueError``
    when not even a one-token source fits (``max_len_b`` too large).
    """
    P = max_side_tokens
    a, b = options.max_len_a, options.max_len_b
    n = P if a == 0 else min(P, int((P - 1 - b) / a) + 1)
    while n > 0 and int(a * n + b) > P - 1:
        n -= 1
    if n < 2:
        raise ValueError(
            f"max_len_a={a}, max_len_b={b} leave no room in max_positions={P}: the output cap "
            "max_len_a * src_len + max_len_b must stay below max_positions"
        )
    return n


class Translator:
    """The input rules (module docstring) in front of ``decoder``, with ``tokenizer`` (the model's own)
    turning text into source ids and output ids back into text."""

    def __init__(self, tokenizer: Tokenizer, decoder: Decoder) -> None:
        self.tokenizer = tokenizer
        self.decoder = decoder

    @classmethod
    def from_dir(
        cls, model_dir: str | Path, *, weights: str | Path | None = None, device: str | torch.device = "auto"
    ) -> "Translator":
        """The trained model folder ``model_dir`` (optionally other weights, e.g. a checkpoint's) decoded
        eagerly on ``device``: ``aiayn.inference.artifacts.ModelBundle.load`` (its errors) + ``EagerDecoder``."""
        bundle = ModelBundle.load(model_dir, weights=weights, device=device)
        return cls(bundle.tokenizer, EagerDecoder(bundle.model))

    @property
    def device(self) -> torch.device:
        """Where the decoder runs."""
        return self.decoder.device

    @property
    def max_side_tokens(self) -> int:
        """The model's longest source (and target with BOS), in tokens: bounds sources and outputs."""
        return self.decoder.max_side_tokens

    # ------------------------------------------------------------------ input -> units

    def max_source_tokens(self, options: DecodeOptions = DecodeOptions()) -> int:
        """Longest source this model translates without clipping, in tokens with EOS
        (``max_source_tokens(self.max_side_tokens, options)``)."""
        return max_source_tokens(self.max_side_tokens, options)

    def prepare(
        self, lines: Sequence[str], options: DecodeOptions = DecodeOptions(), *, long: str = "error",
        warn_unknown: bool = True,
    ) -> PreparedInput:
        """Clean, tokenize and size-check ``lines`` (see the module docstring for the rules).

        Logs one warning when lines hold unknown characters, quoting up to five of them
        (``warn_unknown=False``: none; the caller reports ``report``'s counts, as the service does, so
        no request text reaches its log) and, under ``long="truncate"``, one per truncated line. Raises ``InputError`` (a ``ValueError``) for a line over the limit under
        ``long="error"`` (naming the first such line, its length in tokens and the limit) and
        ``ValueError`` for an unknown ``long`` policy.
        """
        if long not in LONG_POLICIES:
            raise ValueError(f"long-line policy must be one of {LONG_POLICIES}, got {long!r}")
        limit = self.max_source_tokens(options)
        report = InputReport(lines=len(lines), limit=limit)
        texts = [" ".join(clean_line(s).split()) for s in lines]
        encoded = self.tokenizer.encode(texts)
        ids_per_line: list[list[int]] = []
        for text, ids in zip(texts, encoded):
            if UNK_ID in ids:
                ids, unknown = self.tokenizer.encode_known(text)
                report.unknown_lines += 1
                report.unknown_chars.update(unknown)
            if not ids:
                report.blank += not text
            ids_per_line.append(ids)

        too_long = [(n, len(ids) + 1) for n, ids in enumerate(ids_per_line, 1) if len(ids) + 1 > limit]
        report.long_lines = too_long
        if too_long and long == "error":
            n, k = too_long[0]
            more = f" ({len(too_long) - 1} more line(s) too long)" if len(too_long) > 1 else ""
            raise InputError(
                f"input line {n} has {k} tokens (with EOS); this model translates at most {limit} "
                f"(max_positions={self.max_side_tokens}, max_len_a={options.max_len_a}, "
                f"max_len_b={options.max_len_b}){more}; long-line policy 'error': use 'split' or 'truncate'"
            )
        units: list[np.ndarray] = []
        spans: list[tuple[int, int]] = []
        long_set = {n for n, _ in too_long}

        def count(text: str) -> int:
            return len(self.tokenizer.encode_known(text)[0])

        for n, (text, ids) in enumerate(zip(texts, ids_per_line), 1):
            start = len(units)
            if n in long_set and long == "split":  # pieces of <= limit - 1 tokens + EOS
                pieces = [self.tokenizer.encode_known(p)[0] for p in split_long(text, count, limit - 1)]
            elif n in long_set:
                log.warning("input line %d: %d tokens (with EOS), truncated to the model's limit of %d",
                            n, len(ids) + 1, limit)
                pieces = [ids]
            else:
                pieces = [ids]
            for p in pieces:
                if p:
                    units.append(np.asarray(p[: limit - 1] + [EOS_ID], dtype=np.int64))
            spans.append((start, len(units)))
        if report.unknown_lines and warn_unknown:
            sample = ", ".join(repr(c) for c, _ in report.unknown_chars.most_common(5))
            log.warning("%d of %d input line(s) hold characters the tokenizer does not know (%s); they were "
                        "left out of the translation", report.unknown_lines, report.lines, sample)
        if too_long and long == "split":
            log.info("%d input line(s) longer than %d tokens translated in pieces", len(too_long), limit)
        return PreparedInput(units, spans, report)

    def encode(self, sentences: list[str], options: DecodeOptions = DecodeOptions()) -> list[np.ndarray]:
        """Source ids with EOS appended, one ``(len,)`` int64 array per sentence (cleaned, unknown
        characters dropped, as ``prepare`` does). Raises ``InputError`` (a ``ValueError``) for a
        sentence over ``max_source_tokens(options)`` (names the line, 1-based)."""
        prep = self.prepare(sentences, options, long="error")
        return [prep.units[a] if b > a else np.asarray([EOS_ID], dtype=np.int64) for a, b in prep.spans]

    # ------------------------------------------------------------------ units -> output lines

    def output_lines(self, spans: Sequence[tuple[int, int]], ids: list[list[int]], *, first: int = 0) -> list[str]:
        """Detokenized output lines for input lines ``spans`` (``PreparedInput.spans``) from the output ids
        of their units (``ids[k]`` belongs to unit ``first + k``): one line per span, pieces of a split
        line joined by a space, an empty line for a span without units (UNK never emitted)."""
        texts = [output_line(t) for t in self.tokenizer.decode([[i for i in h if i != UNK_ID] for h in ids])]
        return [" ".join(t for t in texts[a - first : b - first] if t) for a, b in spans]

    def scored_lines(
        self, spans: Sequence[tuple[int, int]], hyps: list[list[Hypothesis]], *, len_penalty: float, first: int = 0
    ) -> list[list[ScoredLine]]:
        """The n-best ``ScoredLine`` of each input line ``spans`` from its units' hypotheses (``hyps[k]``:
        unit ``first + k``'s, best first; ``Decoder.translate_hyps``).

        A line of one unit gets that unit's hypotheses with their scores. A line split into pieces gets
        as many as its piece with the fewest: the r-th joins every piece's r-th hypothesis, scored
        ``sum(logprob) / length_penalty(sum(len + 1), len_penalty)``. A line without units (blank)
        gets ``[ScoredLine("", 0.0)]``. Rank 0's text is exactly ``output_lines``'s line.
        """
        flat = [h for unit in hyps for h in unit]
        texts = iter(output_line(t) for t in self.tokenizer.decode([[i for i in h.tokens if i != UNK_ID] for h in flat]))
        text_of = {id(h): next(texts) for h in flat}
        out: list[list[ScoredLine]] = []
        for a, b in spans:
            units = hyps[a - first : b - first]
            if not units or not all(units):
                out.append([ScoredLine("", 0.0)])
                continue
            if len(units) == 1:
                out.append([ScoredLine(text_of[id(h)], h.score) for h in units[0]])
                continue
            ranks = []
            for r in range(min(len(u) for u in units)):
                picked = [u[r] for u in units]
                logprob = sum(h.logprob for h in picked)
                length = sum(len(h.tokens) + 1 for h in picked)
                text = " ".join(t for t in (text_of[id(h)] for h in picked) if t)
                ranks.append(ScoredLine(text, logprob / length_penalty(length, len_penalty)))
            out.append(ranks)
        return out

    def translate_prepared_nbest(
        self,
        prepared: PreparedInput,
        options: DecodeOptions = DecodeOptions(),
        *,
        n_best: int = 1,
        chunk_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[list[list[ScoredLine]]]:
        """``translate_prepared`` with scores: per input line its ``n_best`` best ``ScoredLine``
        (``scored_lines``; at most ``n_best``, greedy gives one), chunked the same way. Raises
        ``ValueError`` unless ``1 <= n_best <= options.beam_size``."""
        for first, spans, hyps in self.decode_prepared(prepared, options, n_best=n_best, chunk_tokens=chunk_tokens,
                                                       progress=progress):
            yield self.scored_lines(spans, hyps, len_penalty=options.len_penalty, first=first)

    def decode_prepared(
        self,
        prepared: PreparedInput,
        options: DecodeOptions = DecodeOptions(),
        *,
        n_best: int = 1,
        chunk_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Iterator[tuple[int, list[tuple[int, int]], list[list[Hypothesis]]]]:
        """The hypotheses behind ``translate_prepared_nbest``, per chunk ``(first, spans, hyps)``: ``hyps[k]``
        the ``n_best`` of unit ``first + k`` (``Decoder.translate_hyps``), ``spans`` the chunk's input lines
        (what ``scored_lines`` and ``aiayn.quality.signals.line_signals`` take)."""
        for first, last, spans in self._chunks(prepared, chunk_tokens):
            yield first, spans, self.decoder.translate_hyps(prepared.units[first:last], options, n_best=n_best)
            if progress:
                progress(len(spans))

    @staticmethod
    def _chunks(prepared: PreparedInput, chunk_tokens: int | None) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
        """``(first unit, last unit, spans)`` of consecutive input lines holding about ``chunk_tokens``
        source tokens each (None: one chunk)."""
        spans, units = prepared.spans, prepared.units
        start = 0
        while start < len(spans):
            end, tokens = start, 0
            while end < len(spans) and (chunk_tokens is None or tokens < chunk_tokens or end == start):
                a, b = spans[end]
                tokens += sum(len(u) for u in units[a:b])
                end += 1
            yield spans[start][0], spans[end - 1][1], spans[start:end]
            start = end

    def translate_prepared(
        self,
        prepared: PreparedInput,
        options: DecodeOptions = DecodeOptions(),
        *,
        chunk_tokens: int | None = None,
        progress: Callable[[int], None] | None = None,
        batch_progress: Callable[[int], None] | None = None,
    ) -> Iterator[list[str]]:
        """Translate ``prepared`` in chunks of consecutive input lines; yields each chunk's output lines
        in input order (concatenated: exactly one line, without line breaks or U+2047, per input line).

        A chunk closes once it holds ``chunk_tokens`` source tokens (``None``: one chunk, so batches
        are length-sorted over the whole input). ``progress(n)`` is called with each chunk's line count,
        ``batch_progress(n)`` with each decoder batch's unit count (a progress bar inside one chunk).
        """
        for first, last, spans in self._chunks(prepared, chunk_tokens):
            ids = self.decoder.translate_ids(prepared.units[first:last], options, progress=batch_progress)
            yield self.output_lines(spans, ids, first=first)
            if progress:
                progress(len(spans))

    def translate(
        self,
        sentences: Iterable[str],
        options: DecodeOptions = DecodeOptions(),
        *,
        long: str = "error",
        progress: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Translate sentences (one per item); returns exactly one detokenized line per item, in order.

        ``prepare`` (with ``long``) then ``translate_prepared`` in one chunk. Raises ``InputError``
        for an over-long line under ``long="error"``.
        """
        prepared = self.prepare(list(sentences), options, long=long)
        return [line for chunk in self.translate_prepared(prepared, options, progress=progress) for line in chunk]
