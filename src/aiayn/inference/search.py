"""Greedy and beam-search decoding over the KV cache (fairseq vocabulary: beam_size, len_penalty, max_len_a/b).

Both decoders need only this from a model (``aiayn.model.Transformer`` has it; a test stub may too):

- ``encode(src (B, S)) -> (memory, src_pad_mask (B, S) bool True=pad)``
- ``decode(tgt_in (B, T), memory, src_pad_mask, *, kv_cache=None) -> logits (B, T, V)``; with a
  cache ``tgt_in`` holds only the newest token and ``memory``/``src_pad_mask`` are passed on the
  first step only (``None`` later: the cache holds the cross-attention keys/values);
- ``new_kv_cache(batch_size, max_len) -> cache`` whose ``reorder(index (B',), *, cross=True)``
  keeps/reorders/repeats rows: the one method beams and batch shrinking use (``cross=False``
  when only beams of the same sentences move, so shared cross-attention state stays put).
- optional ``max_side_tokens`` (int, the longest target with BOS): output lengths are capped at
  ``max_side_tokens - 1``.

Conventions (shared by both decoders, fairseq's defaults):

- Output length cap per sentence: ``max_len = int(max_len_a * src_len + max_len_b)`` tokens
  before EOS, ``src_len`` = non-PAD source tokens, at least 1. At step ``max_len`` only EOS is
  allowed (a hypothesis that reaches the cap ends there; its EOS log-probability counts).
- PAD, BOS and UNK are never generated (UNK: an output must not hold sentencepiece's unknown
  placeholder); EOS is not allowed as the first token (min length 1).
- Returned token lists exclude BOS and EOS.
- Decoding is synchronous: all rows advance one position per step. Finished sentences leave the
  active batch (the cache is reordered to the active rows), so they stop costing compute.

Beam score (Wu et al. 2016, GNMT, eq. 14, used by the paper in Sec. 6.1 with alpha = 0.6)::

    score(Y) = log P(Y | X) / lp(Y),   lp(Y) = ((5 + |Y|) / 6) ** len_penalty

or, with ``length_norm="fairseq"`` (fairseq's ``SequenceGenerator`` ``--lenpen``; 1.0 = the mean
log-probability per token), ``lp(Y) = |Y| ** len_penalty``.

where ``log P`` sums the log-probabilities of every generated token including EOS and ``|Y|``
counts the generated tokens including EOS (BOS excluded). No coverage penalty (beta = 0).

Beam search follows fairseq's ``SequenceGenerator``: at each step the ``2 * beam_size`` best
(beam, token) extensions by cumulative log-probability are taken; EOS extensions ranked within the
first ``beam_size`` become finished hypotheses (scored with the formula above); the first
``beam_size`` non-EOS extensions continue. A sentence is done once it has ``beam_size`` finished
hypotheses or reaches its ``max_len``; the best finished hypothesis by score is returned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = [
    "Hypothesis",
    "length_penalty",
    "max_output_lengths",
    "greedy_decode",
    "greedy_decode_hypotheses",
    "beam_search",
    "beam_search_hypotheses",
]


@dataclass(frozen=True)
class Hypothesis:
    """A finished beam hypothesis: ``tokens`` without BOS/EOS, ``logprob`` = sum of token log-probabilities
    (EOS included), ``score`` = ``logprob / length_penalty(len(tokens) + 1, len_penalty)``."""

    tokens: list[int]
    score: float
    logprob: float


def length_penalty(length: int, alpha: float, norm: str = "gnmt") -> float:
    """Length penalty of a hypothesis of ``length`` tokens incl. EOS: ``norm="gnmt"``: ``((5 + length) / 6) ** alpha``
    (Wu et al. 2016, eq. 14); ``norm="fairseq"``: ``length ** alpha`` (fairseq's ``--lenpen``). Raises ``ValueError``
    for another ``norm``."""
    if norm == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if norm == "fairseq":
        return float(length) ** alpha
    raise ValueError(f"unknown length_norm {norm!r}: use gnmt or fairseq")


def max_output_lengths(
    src: torch.Tensor, *, max_len_a: float, max_len_b: int, max_side_tokens: int | None = None
) -> torch.Tensor:
    """Per-sentence cap on generated tokens before EOS, ``(B,)`` long: ``int(a * src_len + b)``, >= 1.

    ``src_len`` counts non-PAD tokens of ``src`` ``(B, S)``; with ``max_side_tokens`` (the model's
    longest target, ``ModelConfig.max_side_tokens``) the cap is at most ``max_side_tokens - 1`` (BOS +
    ``max_len`` tokens are fed to the decoder). Raises ``ValueError`` for
    negative ``max_len_a`` / ``max_len_b``.
    """
    if max_len_a < 0 or max_len_b < 0:
        raise ValueError(f"max_len_a and max_len_b must be >= 0, got {max_len_a}, {max_len_b}")
    src_lens = src.ne(PAD_ID).sum(dim=1)  # (B,)
    max_lens = (max_len_a * src_lens.double() + max_len_b).floor().long().clamp(min=1)  # (B,)
    if max_side_tokens is not None:
        max_lens = max_lens.clamp(max=max_side_tokens - 1)
    return max_lens


@contextlib.contextmanager
def _inference(model: Any) -> Iterator[None]:
    """``model.eval()`` + ``torch.inference_mode()``; restores the training flag afterwards."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        if was_training:
            model.train(True)


def _check_src(src: torch.Tensor) -> None:
    if src.dim() != 2 or src.dtype != torch.long or src.shape[0] == 0:
        raise ValueError(f"src must be a non-empty (B, S) long tensor of token ids, got {src.dtype} {tuple(src.shape)}")


def _next_logprobs(logits: torch.Tensor, step: int, at_max: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``(N, V)`` of the next token from ``logits`` ``(N, T, V)`` with the rules applied.

    Float32 at least (float64 models stay float64). PAD, BOS and UNK are forbidden, EOS at step 0 too;
    rows with ``at_max`` ``(N,)`` True may only emit EOS.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    lprobs = torch.log_softmax(logits[:, -1].to(dtype), dim=-1)  # (N, V)
    lprobs[:, PAD_ID] = -torch.inf
    lprobs[:, BOS_ID] = -torch.inf
    lprobs[:, UNK_ID] = -torch.inf
    if step == 0:
        lprobs[:, EOS_ID] = -torch.inf
    eos_only = torch.full_like(lprobs, -torch.inf)  # (N, V)
    eos_only[:, EOS_ID] = lprobs[:, EOS_ID]
    return torch.where(at_max[:, None], eos_only, lprobs)


def greedy_decode(
    model: Any, src: torch.Tensor, *, max_len_a: float = 1.0, max_len_b: int = 50, use_cache: bool = True
) -> list[list[int]]:
    """Greedy (argmax) translation of ``src`` ``(B, S)``; returns ``B`` token lists without BOS/EOS.

    ``use_cache=False`` recomputes the whole prefix every step (the reference path). Raises
    ``ValueError`` for a malformed ``src``.
    """
    hyps = greedy_decode_hypotheses(model, src, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache)
    return [h.tokens for h in hyps]


def greedy_decode_hypotheses(
    model: Any,
    src: torch.Tensor,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    use_cache: bool = True,
    len_penalty: float = 0.6,
    length_norm: str = "gnmt",
) -> list[Hypothesis]:
    """Greedy translation of ``src`` ``(B, S)`` with its score: ``B`` ``Hypothesis`` (the tokens
    ``greedy_decode`` returns; ``logprob`` sums every chosen token's log-probability, EOS included;
    ``score = logprob / length_penalty(len + 1, len_penalty, length_norm)``, the beam search's convention).

    Raises ``ValueError`` for a malformed ``src`` or an unknown ``length_norm``.
    """
    _check_src(src)
    length_penalty(1, len_penalty, length_norm)  # raises for an unknown norm before any work
    with _inference(model):
        memory, src_pad_mask = model.encode(src)
        max_lens = max_output_lengths(
            src, max_len_a=max_len_a, max_len_b=max_len_b, max_side_tokens=getattr(model, "max_side_tokens", None)
        )  # (B,)
        B = src.shape[0]
        rows = torch.arange(B, device=src.device)  # (N,) original sentence of each active row
        tokens = torch.full((B, 1), BOS_ID, dtype=torch.long, device=src.device)  # (N, t + 1)
        logprob = torch.zeros(B, dtype=torch.float64, device=src.device)  # (N,) sum of chosen log-probabilities
        cache = model.new_kv_cache(B, int(max_lens.max()) + 1) if use_cache else None
        out: list[Hypothesis] = [Hypothesis([], 0.0, 0.0)] * B
        for step in range(int(max_lens.max()) + 1):
            if cache is not None:
                mem, mask = (memory, src_pad_mask) if step == 0 else (None, None)
                logits = model.decode(tokens[:, -1:], mem, mask, kv_cache=cache)  # (N, 1, V)
            else:
                logits = model.decode(tokens, memory, src_pad_mask)  # (N, t + 1, V)
            lprobs = _next_logprobs(logits, step, max_lens[rows] == step)  # (N, V)
            next_tok = lprobs.argmax(dim=-1)  # (N,)
            logprob = logprob + lprobs.gather(1, next_tok[:, None])[:, 0].double()  # (N,)
            done = next_tok.eq(EOS_ID)  # (N,)
            if bool(done.any()):
                for r, toks, lp in zip(rows[done].tolist(), tokens[done, 1:].tolist(), logprob[done].tolist()):
                    out[r] = Hypothesis(toks, lp / length_penalty(len(toks) + 1, len_penalty, length_norm), lp)
                keep = (~done).nonzero().squeeze(1)  # (N',)
                if keep.numel() == 0:
                    break
                rows, tokens, next_tok, logprob = rows[keep], tokens[keep], next_tok[keep], logprob[keep]
                if cache is not None:
                    cache.reorder(keep)
                else:
                    memory, src_pad_mask = memory.index_select(0, keep), src_pad_mask.index_select(0, keep)
            tokens = torch.cat([tokens, next_tok[:, None]], dim=1)  # (N, t + 2)
        return out


def beam_search_hypotheses(
    model: Any,
    src: torch.Tensor,
    *,
    beam_size: int = 4,
    len_penalty: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    use_cache: bool = True,
    length_norm: str = "gnmt",
) -> list[list[Hypothesis]]:
    """Beam search over ``src`` ``(B, S)``; per sentence, every finished ``Hypothesis``, best score first.

    All sentences x beams live in one batch. The first step runs once per sentence (every beam
    would be identical), so cross-attention keys/values are computed once per source; the cache
    is then expanded to ``beam_size`` rows per sentence by ``reorder``. Raises ``ValueError``
    for ``beam_size < 1``, ``2 * beam_size`` > vocabulary, a malformed ``src`` or an unknown ``length_norm``.
    """
    _check_src(src)
    length_penalty(1, len_penalty, length_norm)  # raises for an unknown norm before any work
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    K = beam_size
    with _inference(model):
        memory, src_pad_mask = model.encode(src)
        max_lens = max_output_lengths(
            src, max_len_a=max_len_a, max_len_b=max_len_b, max_side_tokens=getattr(model, "max_side_tokens", None)
        )  # (B,)
        B, device = src.shape[0], src.device
        sent = torch.arange(B, device=device)  # (N,) original sentence of each active sentence
        tokens = torch.full((B, 1), BOS_ID, dtype=torch.long, device=device)  # (N * k, t + 1), k = 1 at step 0
        scores = torch.zeros(B, 1, device=device)  # (N, k) cumulative log-probabilities
        k = 1  # beams per active sentence: 1 before the first expansion, then K
        cache = model.new_kv_cache(B, int(max_lens.max()) + 1) if use_cache else None
        finished: list[list[Hypothesis]] = [[] for _ in range(B)]
        for step in range(int(max_lens.max()) + 1):
            N = sent.shape[0]
            if cache is not None:
                mem, mask = (memory, src_pad_mask) if step == 0 else (None, None)
                logits = model.decode(tokens[:, -1:], mem, mask, kv_cache=cache)  # (N * k, 1, V)
            else:
                logits = model.decode(tokens, memory, src_pad_mask)  # (N * k, t + 1, V)
            at_max = (max_lens[sent] == step).repeat_interleave(k)  # (N * k,)
            lprobs = _next_logprobs(logits, step, at_max)  # (N * k, V)
            V = lprobs.shape[1]
            if 2 * K > V:
                raise ValueError(f"beam_size={K} needs a vocabulary of at least {2 * K} tokens, got {V}")
            cand = scores.to(lprobs.dtype)[:, :, None] + lprobs.view(N, k, V)  # (N, k, V)
            top_scores, top_idx = cand.view(N, k * V).topk(min(2 * K, k * V), dim=1)  # (N, C), best first
            top_beam, top_tok = top_idx // V, top_idx % V  # (N, C) beam within sentence, token
            is_eos = top_tok.eq(EOS_ID)  # (N, C)

            _add_finished(finished, sent, tokens, top_scores, top_beam, is_eos, k, K,
                          lambda n_tokens: length_penalty(n_tokens, len_penalty, length_norm))

            # Continuing beams: the first K non-EOS extensions (stable sort keeps score order).
            order = torch.sort(is_eos.to(torch.int32), dim=1, stable=True).indices[:, :K]  # (N, K)
            next_beam, next_tok = top_beam.gather(1, order), top_tok.gather(1, order)  # (N, K)
            next_scores = top_scores.gather(1, order)  # (N, K)

            n_done = torch.tensor([len(finished[s]) for s in sent.tolist()], device=device)  # (N,)
            alive = (n_done < K) & (max_lens[sent] > step)  # (N,)
            if not bool(alive.any()):
                break
            keep = alive.nonzero().squeeze(1)  # (N',)
            index = (keep[:, None] * k + next_beam[keep]).view(-1)  # (N' * K,) source row of each new beam
            tokens = torch.cat([tokens.index_select(0, index), next_tok[keep].view(-1, 1)], dim=1)  # (N' * K, t + 2)
            scores = next_scores[keep]  # (N', K)
            sent = sent[keep]
            if cache is not None:
                # Same sentences, K beams each: only beams move, the cross-attention state is shared.
                cache.reorder(index, cross=not (k == K and keep.numel() == N))
            else:
                memory, src_pad_mask = memory.index_select(0, index), src_pad_mask.index_select(0, index)
            k = K
        return [sorted(h, key=lambda h: h.score, reverse=True) for h in finished]



def _add_finished(finished: list[list[Hypothesis]], sent: torch.Tensor, tokens: torch.Tensor,
                  top_scores: torch.Tensor, top_beam: torch.Tensor, is_eos: torch.Tensor, k: int, K: int,
                  penalty: Callable[[int], float]) -> None:
    """Append one beam step's finished hypotheses to ``finished`` (per original sentence, at most ``K``):
    the EOS extensions ranked within the first ``K`` candidates with a finite score. ``sent`` ``(N,)``,
    ``tokens`` ``(N * k, t + 1)``, ``top_scores``/``top_beam``/``is_eos`` ``(N, C)``; ``penalty(n)`` is
    the length penalty of ``n`` tokens including EOS."""
    fin = (is_eos[:, :K] & top_scores[:, :K].isfinite()).nonzero()  # (F, 2): (sentence, rank)
    if not fin.numel():
        return
    n, r = fin[:, 0], fin[:, 1]
    fin_rows = n * k + top_beam[n, r]  # (F,) rows of tokens
    for s, toks, lp in zip(sent[n].tolist(), tokens[fin_rows, 1:].tolist(), top_scores[n, r].tolist()):
        if len(finished[s]) < K:
            finished[s].append(Hypothesis(toks, lp / penalty(len(toks) + 1), lp))

def beam_search(
    model: Any,
    src: torch.Tensor,
    *,
    beam_size: int = 4,
    len_penalty: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    use_cache: bool = True,
    length_norm: str = "gnmt",
) -> list[list[int]]:
    """Best beam hypothesis per sentence of ``src`` ``(B, S)``: ``B`` token lists without BOS/EOS.

    See ``beam_search_hypotheses`` and the module docstring for the scoring convention.
    """
    hyps = beam_search_hypotheses(
        model, src, beam_size=beam_size, len_penalty=len_penalty,
        max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache, length_norm=length_norm,
    )  # fmt: skip
    return [h[0].tokens if h else [] for h in hyps]
