"""Decoders: source id arrays in, output ids out, under OUR decoding rules (``aiayn.decode``).

One contract for every runtime (``Decoder``): ``translate_ids(sources, options, *, batch_size=None)``
takes ``(len,)`` int64 source arrays with EOS appended and returns the output ids (no BOS/EOS) in input
order; ``score_ids(sources, targets)`` gives teacher-forced log-probabilities. ``EagerDecoder`` runs
our PyTorch model (``aiayn.decode``'s greedy/beam search); ``CT2Decoder`` a converted CTranslate2
model. Both batch with ``sorted_batches``: sources sorted by length, then ``batch_size`` rows per
batch, or (``batch_size=None``) as many as fit ``options.max_tokens`` padded source tokens.
``aiayn.translate.Translator`` puts the input rules (cleaning, unknown characters, long lines) in
front of either.

How ``CT2Decoder`` reproduces each rule of ``aiayn.decode`` with CTranslate2 4.8:

- Length cap. CTranslate2 has one ``max_decoding_length`` per call (steps, the end token included)
  and no per-sentence ``a * src_len + b``. Decision: sentences are sorted by length and batched; each
  call gets the batch's largest cap, passed explicitly as ``max_decoding_length = cap + 1`` (our cap
  counts tokens before EOS; at step ``cap`` we allow only EOS). Then every sentence is cut back to its
  own cap: exact for greedy (a row's greedy prefix never depends on the others). For beam search a
  sentence whose search ran past its own cap (an n-best hypothesis longer than the cap, or none
  ending in EOS) is decoded again alone with its own cap (rare: only looping outputs reach it).
- Min length 1, PAD, BOS and UNK never generated (``aiayn.decode``'s rule): ``min_decoding_length=1``
  (EOS disabled at step 0) and ``suppress_sequences=[[<pad>], [<s>], [<unk>]]``.
- Beam search with the GNMT length penalty (``((5 + |Y|) / 6) ** alpha``): CTranslate2's
  ``length_penalty`` is a plain length exponent (``score / |Y| ** lp``). Decision: ask for the whole
  n-best (``num_hypotheses = beam``) with ``length_penalty=1`` and ``return_end_token=True``, undo
  its normalisation (``raw = score * |Y|``, |Y| with EOS) and re-rank with our formula. A non-zero
  penalty also keeps fairseq's stopping rule (a sentence ends once ``beam`` hypotheses finished;
  with ``length_penalty=0`` CTranslate2 exits as soon as the top beam ends). The search itself is
  fairseq's (2 x beam candidates, EOS within the first ``beam`` finishes a hypothesis), so only the
  final ranking needed fixing.

``ctranslate2`` is imported when a ``CT2Decoder`` is built, so eager decoding never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from aiayn.batching import pad_batch
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID, EvalConfig
from aiayn.decode import beam_search, greedy_decode, length_penalty, max_output_lengths
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
    length_norm: str = "gnmt"  # beam score normalisation: gnmt ((5+|Y|)/6)**a, or fairseq |Y|**a (aiayn.decode)

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
    """What ``aiayn.translate.Translator`` (and the service's micro-batcher) needs from a runtime."""

    @property
    def device(self) -> torch.device: ...

    @property
    def max_side_tokens(self) -> int:
        """Longest source, and longest target with BOS, in tokens (``ModelConfig.max_side_tokens``)."""
        ...

    def translate_ids(self, sources: list[np.ndarray], options: DecodeOptions = DecodeOptions(), *,
                      batch_size: int | None = None,
                      progress: Callable[[int], None] | None = None) -> list[list[int]]: ...

    def score_ids(self, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]: ...


class EagerDecoder:
    """Our PyTorch model decoded by ``aiayn.decode`` (greedy for ``beam_size=1``, else beam search) on
    the model's device. ``model``: an ``aiayn.model.Transformer`` (or anything ``aiayn.decode`` can
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

    @torch.inference_mode()
    def translate_ids(
        self,
        sources: list[np.ndarray],
        options: DecodeOptions = DecodeOptions(),
        *,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Decode source id arrays (EOS included); output ids (no BOS/EOS) in input order. Batches:
        ``sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens)``, each padded
        ``(B, S)`` on the model's device. ``progress(n)`` is called with each batch's size."""
        results: list[list[int]] = [[] for _ in sources]
        device = self.device
        for idx in sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens):
            src = pad_batch([sources[i] for i in idx]).to(device)  # (B, S)
            if options.beam_size == 1:
                hyps = greedy_decode(self.model, src, max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                                     use_cache=options.use_cache)
            else:
                hyps = beam_search(self.model, src, beam_size=options.beam_size, len_penalty=options.len_penalty,
                                   max_len_a=options.max_len_a, max_len_b=options.max_len_b,
                                   use_cache=options.use_cache, length_norm=options.length_norm)
            for i, h in zip(idx, hyps):
                results[i] = list(h)
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
        """Per-sentence output caps, exactly ``aiayn.decode.max_output_lengths``."""
        return max_output_lengths(
            pad_batch(sources), max_len_a=options.max_len_a, max_len_b=options.max_len_b,
            max_side_tokens=self.max_side_tokens,
        ).tolist()

    def _run(self, sources: list[np.ndarray], cap: int, beam: int, *, asynchronous: bool = False):
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

    def _best(self, hyps: list[_Hyp], cap: int, alpha: float, norm: str = "gnmt") -> list[int]:
        def gnmt(h: _Hyp) -> float:
            n = min(len(h.tokens), cap)
            return h.logprob / length_penalty(n + 1, alpha, norm)

        return min(hyps, key=lambda h: -gnmt(h)).tokens[:cap] if hyps else []

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
        jobs = []
        for idx in sorted_batches(sources, batch_size=batch_size, max_tokens=options.max_tokens):
            srcs = [sources[i] for i in idx]
            caps = self.caps(srcs, options)
            jobs.append((idx, caps, srcs, self._run(srcs, max(caps), beam, asynchronous=True)))
        for idx, caps, srcs, pending in jobs:
            outs = [p.result() for p in pending]
            for i, cap, src, res in zip(idx, caps, srcs, outs):
                if beam == 1:
                    toks = res.hypotheses[0]
                    toks = toks[:-1] if toks and toks[-1] == self._eos else toks
                    results[i] = [self.piece_id[t] for t in toks][:cap]
                    continue
                hyps = self._hyps(res)
                if any(len(h.tokens) > cap for h in hyps) or not any(h.ended for h in hyps):
                    hyps = self._hyps(self._run([src], cap, beam)[0])  # its own cap, alone
                results[i] = self._best(hyps, cap, options.len_penalty, options.length_norm)
            if progress:
                progress(len(idx))
        return results

    def score_ids(self, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]:
        """Teacher-forced log-probabilities of each target token and the final EOS: ``(len + 1,)`` each."""
        res = self.translator.score_batch([self._tok(s) for s in sources], [self._tok(t) for t in targets],
                                          max_input_length=0)
        return [np.asarray(r.log_probs, dtype=np.float64) for r in res]
