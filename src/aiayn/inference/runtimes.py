"""Decoders: source id arrays in, output ids out, under OUR decoding rules (``aiayn.inference.search``).

One contract for every runtime (``Decoder``): ``translate_ids(sources, options, *, batch_size=None)``
takes ``(len,)`` int64 source arrays with EOS appended and returns the output ids (no BOS/EOS) in input
order; its sibling ``translate_hyps(sources, options, *, n_best=1, ...)`` returns, per source, the
``n_best`` best hypotheses (``aiayn.inference.search.Hypothesis``: tokens, length-normalised score, log-probability),
best first, whose first tokens are exactly ``translate_ids``'s output; ``score_ids(sources, targets)``
gives teacher-forced log-probabilities. ``EagerDecoder`` runs
our PyTorch model (``aiayn.inference.search``'s greedy/beam search); ``CT2Decoder`` a converted CTranslate2
model. Both batch with ``sorted_batches``: sources sorted by length, then ``batch_size`` rows per
batch, or (``batch_size=None``) as many as fit ``options.max_tokens`` padded source tokens.
``aiayn.inference.translator.Translator`` puts the input rules (cleaning, unknown characters, long lines) in
front of either.

How ``CT2Decoder`` reproduces each rule of ``aiayn.inference.search`` with CTranslate2 4.8:

- Length cap. CTranslate2 has one ``max_decoding_length`` per call (steps, the end token included)
  and no per-sentence ``a * src_len + b``. Decision: sentences are sorted by length and batched; each
  call gets the batch's largest cap, passed explicitly as ``max_decoding_length = cap + 1`` (our cap
  counts tokens before EOS; at step ``cap`` we allow only EOS). Then every sentence is cut back to its
  own cap: exact for greedy (a row's greedy prefix never depends on the others). For beam search a
  sentence whose search ran past its own cap (an n-best hypothesis longer than the cap, or none
  ending in EOS) is decoded again alone with its own cap (rare: only looping outputs reach it).
- Min length 1, PAD, BOS and UNK never generated (``aiayn.inference.search``'s rule): ``min_decoding_length=1``
  (EOS disabled at step 0) and ``suppress_sequences=[[<pad>], [<s>], [<unk>]]``.
- Beam search with the GNMT length penalty (``((5 + |Y|) / 6) ** alpha``): CTranslate2's
  ``length_penalty`` is a plain length exponent (``score / |Y| ** lp``). Decision: ask for the whole
  n-best (``num_hypotheses = beam``) with ``length_penalty=1`` and ``return_end_token=True``, undo
  its normalisation (``raw = score * |Y|``, |Y| with EOS) and re-rank with our formula. A non-zero
  penalty also keeps fairseq's stopping rule (a sentence ends once ``beam`` hypotheses finished;
  with ``length_penalty=0`` CTranslate2 exits as soon as the top beam ends). The search itself is
  fairseq's (2 x beam candidates, EOS within the first ``beam`` finishes a hypothesis), so only the
  final ranking needed fixing.
- Scores (``translate_hyps``): CTranslate2 renormalises each step's distribution over the tokens it
  may emit (suppressed tokens, EOS at step 0), and at a sentence's cap it counts the token it chose
  where our decoder forces EOS, so its own scores are not ours (0.2 nats apart on a 4-token output
  of a small model). Decision: the hypotheses it returns are re-scored teacher-forced (one
  ``score_batch`` call over them all: the model's full-softmax log-probability of the tokens + EOS,
  what ``aiayn.inference.search`` sums), then ``score = logprob / ((5 + |Y|) / 6) ** alpha``. The ranking
  stays the search's (so the 1-best is ``translate_ids``'s); an n-best list's scores may then be out
  of order where the two conventions disagree.

``ctranslate2`` is imported when a ``CT2Decoder`` is built, so eager decoding never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from aiayn.data.batching import pad_batch
from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, EvalConfig
from aiayn.inference.search import Hypothesis, beam_search_hypotheses, greedy_decode_hypotheses, length_penalty, max_output_lengths
from aiayn.tokenizer import Tokenizer

__all__ = ["DecodeOptions", "Decoder", "EagerDecoder", "CT2Decoder", "sorted_batches"]


@dataclass(frozen=True)
class DecodeOptions:
    """Decoding knobs (defaults: paper Section 6.1). ``beam_size=1`` means greedy."""

    beam_size: int = 4
    len_penalty: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    max_tokens: int = 4000  # source tokens per batch
    use_cache: bool = True  # False: recompute the whole prefix each step (reference path, benchmarks)
    length_norm: str = "gnmt"  # beam score normalisation: gnmt ((5+|Y|)/6)**a, or fairseq |Y|**a (aiayn.inference.search)

    @classmethod
    def from_eval(cls, e: EvalConfig) -> "DecodeOptions":
        """The pipeline's decoding options: the ``evaluate`` block (used by evaluate, quantize and the
        serving bundle alike)."""
        return cls(beam_size=e.beam_size, len_penalty=e.len_penalty, max_len_a=e.max_len_a,
                   max_len_b=e.max_len_b, max_tokens=e.max_tokens, length_norm=e.length_norm)


def sorted_batches(sources: list[np.ndarray], *, batch_size: int | None = None, max_tokens: int = 4000) -> list[list[int]]:
    """Index batches over length-sorted ``sources`` (stable: equal lengths keep input order):
    ``batch_size`` rows each, else each batch grows while ``rows x longest source <= max_tokens``
    padded source tokens (a source longer than ``max_tokens`` gets a batch of its own)."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    if batch_size is not None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(sources[order[end]]) <= max_tokens:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


class Decoder(Protocol):
    """What ``aiayn.inference.translator.Translator`` (and the service's micro-batcher) needs from a runtime."""

    @property
    def device(self) -> torch.device: ...

    @property
    def max_side_tokens(self) -> int:
        """Longest source, and longest target with BOS, in tokens (``ModelConfig.max_side_tokens``)."""
        ...

    def translate_ids(self, sources: list[np.ndarray], options: DecodeOptions = DecodeOptions(), *,
                      batch_size: int | None = None,
                      progress: Callable[[int], None] | None = None) -> list[list[int]]: ...

    def translate_hyps(self, sources: list[np.ndarray], options: DecodeOptions = DecodeOptions(), *,
                       n_best: int = 1, batch_size: int | None = None,
                       progress: Callable[[int], None] | None = None) -> list[list[Hypothesis]]: ...

    def score_ids(self, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]: ...


def _check_n_best(n_best: int, options: DecodeOptions) -> None:
    if not 1 <= n_best <= options.beam_size:
        raise ValueError(f"n_best must be from 1 to beam_size ({options.beam_size}), got {n_best}")


class EagerDecoder:
    """Our PyTorch model decoded by ``aiayn.inference.search`` (greedy for ``beam_size=1``, else beam search) on
    the model's device. ``model``: an ``aiayn.model.Transformer`` (or anything ``aiayn.inference.search`` can
    drive, with a ``max_side_tokens`` attribute and parameters); put in eval mode here."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.eval()

    @property
    def device(self) -> torch.device:
        """Where the model's parameters (and every decoding batch) live."""
        return next(self.model.parameters()).device

    @property
    def max_side_tokens(self) -> int:
        return self.model.max_side_tokens

    def translate_ids(
        self,
        sources: list[np.ndarray],
        options: DecodeOptions = DecodeOptions(),
        *,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Decode source id arrays (EOS included); output ids (no BOS/EOS) in input order: the best
        hypothesis of ``translate_hyps``."""
        hyps = self.translate_hyps(sources, options, batch_size=batch_size, progress=progress)
        return [h[0].tokens if h else [] for h in hyps]

    @torch.inference_mode()
    def translate_hyps(
        self,
        sources: list[np.ndarray],
        options: DecodeOptions = DecodeOptions(),
        *,
        n_best: int = 1,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` best hypotheses per source (greedy: its one), best first, in input order.
        Batches: ``sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens)``, each
        padded ``(B, S)`` on the model's device. ``progress(n)`` is called with each batch's size.
        Raises ``ValueError`` unless ``1 <= n_best <= options.beam_size``."""
        _check_n_best(n_best, options)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        device = self.device
        for idx in sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens):
            src = pad_batch([sources[i] for i in idx]).to(device)  # (B, S)
            if options.beam_size == 1:
                hyps = [[h] for h in greedy_decode_hypotheses(
                    self.model, src, max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                    use_cache=options.use_cache, len_penalty=options.len_penalty,
                    length_norm=options.length_norm)]
            else:
                hyps = beam_search_hypotheses(self.model, src, beam_size=options.beam_size,
                                              len_penalty=options.len_penalty, max_len_a=options.max_len_a,
                                              max_len_b=options.max_len_b, use_cache=options.use_cache,
                                              length_norm=options.length_norm)
            for i, h in zip(idx, hyps):
                results[i] = list(h[:n_best])
            if progress:
                progress(len(idx))
        return results

    @torch.inference_mode()
    def score_ids(self, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]:
        """Teacher-forced log-probabilities of each target token and the final EOS: ``(len + 1,)`` float64
        each (one sentence per forward pass, no padding)."""
        device = self.device
        out = []
        for src, tgt in zip(sources, targets):
            src_in = torch.as_tensor(np.asarray(src, dtype=np.int64), device=device)[None]  # (1, S)
            tgt_in = torch.tensor([[BOS_ID, *tgt]], device=device)  # (1, T + 1)
            logits = self.model(src_in, tgt_in)  # (1, T + 1, V)
            lp = torch.log_softmax(logits[0].double(), dim=-1)
            out.append(lp[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS_ID])].cpu().numpy())
        return out


@dataclass(frozen=True)
class _Hyp:
    tokens: list[int]
    logprob: float
    ended: bool  # finished with EOS (else cut by the step limit)


class CT2Decoder:
    """A CTranslate2 model directory + our tokenizer, decoding under our rules (module docstring).

    ``max_side_tokens``: the model's ``ModelConfig.max_side_tokens`` (caps outputs like the eager
    model). ``inter_threads`` workers of ``intra_threads`` threads each decode batches in parallel.
    """

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Tokenizer,
        *,
        max_side_tokens: int,
        device: str = "cpu",
        compute_type: str = "default",
        intra_threads: int = 1,
        inter_threads: int = 1,
    ) -> None:
        import ctranslate2  # here, so that eager decoding never loads it

        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer
        self.max_side_tokens = max_side_tokens
        self.compute_type = compute_type
        self.translator = ctranslate2.Translator(
            str(model_dir), device=device, compute_type=compute_type, intra_threads=intra_threads,
            inter_threads=inter_threads,
        )
        self.pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        self.piece_id = {p: i for i, p in enumerate(self.pieces)}
        self._suppress = [[self.pieces[PAD_ID]], [self.pieces[BOS_ID]], [self.pieces[UNK_ID]]]
        self._eos = self.pieces[EOS_ID]

    @property
    def device(self) -> torch.device:
        return torch.device(self.translator.device)

    # ------------------------------------------------------------------ helpers

    def _tok(self, ids) -> list[str]:
        return [self.pieces[int(i)] for i in ids]

    def caps(self, sources: list[np.ndarray], options: DecodeOptions) -> list[int]:
        """Per-sentence output caps, exactly ``aiayn.inference.search.max_output_lengths``."""
        return max_output_lengths(
            pad_batch(sources), max_len_a=options.max_len_a, max_len_b=options.max_len_b,
            max_side_tokens=self.max_side_tokens,
        ).tolist()

    def _run(self, sources: list[np.ndarray], cap: int, beam: int, *, asynchronous: bool = False):
        """CTranslate2's search under our rules (module docstring)."""
        return self.translator.translate_batch(
            [self._tok(s) for s in sources],
            beam_size=beam,
            num_hypotheses=beam,
            patience=1,
            length_penalty=1.0 if beam > 1 else 0.0,
            max_decoding_length=cap + 1,  # explicit, always: cap tokens + the EOS step
            min_decoding_length=1,
            max_input_length=0,
            suppress_sequences=self._suppress,
            return_end_token=beam > 1,
            return_scores=beam > 1,
            asynchronous=asynchronous,
        )

    def _hyps(self, result) -> list[_Hyp]:
        out = []
        for toks, score in zip(result.hypotheses, result.scores):
            ended = bool(toks) and toks[-1] == self._eos
            ids = [self.piece_id[t] for t in (toks[:-1] if ended else toks)]
            out.append(_Hyp(ids, float(score) * len(toks), ended))  # undo score / |Y| ** 1
        return out

    @staticmethod
    def _ranked(hyps: list[_Hyp], cap: int, alpha: float, norm: str = "gnmt") -> list[_Hyp]:
        """``hyps`` best first by our score (``length_norm`` ``norm``; stable: ties keep CTranslate2's order)."""
        def gnmt(h: _Hyp) -> float:
            n = min(len(h.tokens), cap)
            return h.logprob / length_penalty(n + 1, alpha, norm)

        return sorted(hyps, key=lambda h: -gnmt(h))

    def _best(self, hyps: list[_Hyp], cap: int, alpha: float, norm: str = "gnmt") -> list[int]:
        return self._ranked(hyps, cap, alpha, norm)[0].tokens[:cap] if hyps else []

    def _searched(self, sources: list[np.ndarray], options: DecodeOptions, batch_size: int | None):
        """Submit every batch at once, then yield ``(idx, caps, [(source, result), ...])`` per batch in
        submission order (``translate_ids``)."""
        jobs = []
        for idx in sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens):
            srcs = [sources[i] for i in idx]
            caps = self.caps(srcs, options)
            jobs.append((idx, caps, srcs, self._run(srcs, max(caps), options.beam_size, asynchronous=True)))
        for idx, caps, srcs, pending in jobs:
            yield idx, caps, list(zip(srcs, (p.result() for p in pending)))

    def _own_cap(self, hyps: list[_Hyp], src: np.ndarray, cap: int, beam: int) -> list[_Hyp]:
        """A beam whose search ran past this sentence's own cap (or ended nowhere) is searched again
        alone with its own cap (module docstring)."""
        if beam > 1 and (any(len(h.tokens) > cap for h in hyps) or not any(h.ended for h in hyps)):
            return self._hyps(self._run([src], cap, beam)[0])
        return hyps

    # ------------------------------------------------------------------ API

    def translate_ids(
        self,
        sources: list[np.ndarray],
        options: DecodeOptions = DecodeOptions(),
        *,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Decode source id arrays (EOS included); output ids (no BOS/EOS) in input order.

        Every batch (``sorted_batches``) is submitted at once (``asynchronous=True``) so that
        ``inter_threads`` workers decode batches in parallel; results are collected in submission
        order, and each batch's output does not depend on which worker ran it. ``progress(n)`` is
        called with each batch's size as its results are collected."""
        results: list[list[int]] = [[] for _ in sources]
        beam = options.beam_size
        for idx, caps, done in self._searched(sources, options, batch_size):
            for i, cap, (src, res) in zip(idx, caps, done):
                if beam == 1:
                    toks = res.hypotheses[0]
                    toks = toks[:-1] if toks and toks[-1] == self._eos else toks
                    results[i] = [self.piece_id[t] for t in toks][:cap]
                    continue
                hyps = self._own_cap(self._hyps(res), src, cap, beam)
                results[i] = self._best(hyps, cap, options.len_penalty, options.length_norm)
            if progress:
                progress(len(idx))
        return results

    def translate_hyps(
        self,
        sources: list[np.ndarray],
        options: DecodeOptions = DecodeOptions(),
        *,
        n_best: int = 1,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[Hypothesis]]:
        """The ``n_best`` best hypotheses per source (greedy: its one), in the order our ranking puts them,
        in input order, scored as ``aiayn.inference.search`` scores them (module docstring: teacher-forced, one
        ``score_batch`` call). The first hypothesis's tokens are ``translate_ids``'s output.
        Raises ``ValueError`` unless ``1 <= n_best <= options.beam_size``."""
        _check_n_best(n_best, options)
        beam, alpha = options.beam_size, options.len_penalty
        picked: list[list[list[int]]] = [[] for _ in sources]
        for idx, caps, done in self._searched(sources, options, batch_size):
            for i, cap, (src, res) in zip(idx, caps, done):
                if beam == 1:
                    toks = res.hypotheses[0]
                    picked[i] = [[self.piece_id[t] for t in (toks[:-1] if toks and toks[-1] == self._eos else toks)][:cap]]
                    continue
                hyps = self._own_cap(self._hyps(res), src, cap, beam)
                picked[i] = [h.tokens[:cap] for h in self._ranked(hyps, cap, alpha, options.length_norm)[:n_best]]
            if progress:
                progress(len(idx))
        flat = [(i, toks) for i, hyps in enumerate(picked) for toks in hyps]
        logprobs = iter(lps.sum() for lps in self.score_ids([sources[i] for i, _ in flat], [t for _, t in flat]))
        return [[Hypothesis(toks, lp / length_penalty(len(toks) + 1, alpha, options.length_norm), lp)
                 for toks, lp in ((t, float(next(logprobs))) for t in hyps)] for hyps in picked]

    def score_ids(self, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]:
        """Teacher-forced log-probabilities of each target token and the final EOS: ``(len + 1,)`` each."""
        res = self.translator.score_batch([self._tok(s) for s in sources], [self._tok(t) for t in targets],
                                          max_input_length=0)
        return [np.asarray(r.log_probs, dtype=np.float64) for r in res]
