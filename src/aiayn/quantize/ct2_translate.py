"""Decode with a converted CTranslate2 model under OUR decoding rules (``aiayn.decode``).

How each rule of ``aiayn.decode`` is reproduced with CTranslate2 4.8:

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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import numpy as np

from aiayn.batching import pad_batch
from aiayn.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from aiayn.decode import length_penalty, max_output_lengths
from aiayn.tokenizer import Tokenizer
from aiayn.translate import DecodeOptions

__all__ = ["CT2Translator", "sorted_batches"]


def sorted_batches(sources: list[np.ndarray], *, batch_size: int | None = None, max_tokens: int = 4000) -> list[list[int]]:
    """Index batches over length-sorted ``sources``: ``batch_size`` rows each, else up to ``max_tokens``
    padded source tokens (``aiayn.translate.Translator.translate_ids``'s rule)."""
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


@dataclass(frozen=True)
class _Hyp:
    tokens: list[int]
    logprob: float
    ended: bool  # finished with EOS (else cut by the step limit)


class CT2Translator:
    """A CTranslate2 model directory + our tokenizer, decoding id arrays like ``aiayn.translate.Translator``."""

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer: Tokenizer,
        *,
        max_positions: int,
        device: str = "cpu",
        compute_type: str = "default",
        intra_threads: int = 1,
        inter_threads: int = 1,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer
        self.max_positions = max_positions
        self.compute_type = compute_type
        self.translator = ctranslate2.Translator(
            str(model_dir), device=device, compute_type=compute_type, intra_threads=intra_threads,
            inter_threads=inter_threads,
        )
        self.pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
        self.piece_id = {p: i for i, p in enumerate(self.pieces)}
        self._suppress = [[self.pieces[PAD_ID]], [self.pieces[BOS_ID]], [self.pieces[UNK_ID]]]
        self._eos = self.pieces[EOS_ID]

    # ------------------------------------------------------------------ helpers

    def _tok(self, ids) -> list[str]:
        return [self.pieces[int(i)] for i in ids]

    def caps(self, sources: list[np.ndarray], options: DecodeOptions) -> list[int]:
        """Per-sentence output caps, exactly ``aiayn.decode.max_output_lengths``."""
        return max_output_lengths(
            pad_batch(sources), max_len_a=options.max_len_a, max_len_b=options.max_len_b, max_positions=self.max_positions
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

    def _best(self, hyps: list[_Hyp], cap: int, alpha: float) -> list[int]:
        def gnmt(h: _Hyp) -> float:
            n = min(len(h.tokens), cap)
            return h.logprob / length_penalty(n + 1, alpha)

        return min(hyps, key=lambda h: -gnmt(h)).tokens[:cap] if hyps else []

    # ------------------------------------------------------------------ API

    def translate_ids(
        self, sources: list[np.ndarray], options: DecodeOptions = DecodeOptions(), *, batch_size: int | None = None
    ) -> list[list[int]]:
        """Decode source id arrays (EOS included); output ids (no BOS/EOS) in input order.

        Every batch is submitted at once (``asynchronous=True``) so that ``inter_threads`` workers
        decode batches in parallel; results are collected in submission order, and each batch's
        output does not depend on which worker ran it."""
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
                results[i] = self._best(hyps, cap, options.len_penalty)
        return results

    def score_ids(self, sources: list[np.ndarray], targets: list[list[int]]) -> list[np.ndarray]:
        """Teacher-forced log-probabilities of each target token and the final EOS: ``(len + 1,)`` each."""
        res = self.translator.score_batch([self._tok(s) for s in sources], [self._tok(t) for t in targets],
                                          max_input_length=0)
        return [np.asarray(r.log_probs, dtype=np.float64) for r in res]
