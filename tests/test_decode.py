"""Greedy and beam-search decoding: cache vs recompute, batch invariance, length penalty, early finishing.

Real-model tests use a seeded random tiny Transformer in float64, so exact token equality between
code paths is not at the mercy of float32 near-ties.
"""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, model_preset
from aiayn.inference.search import (
    Hypothesis,
    beam_search,
    beam_search_hypotheses,
    greedy_decode,
    greedy_decode_hypotheses,
    length_penalty,
    max_output_lengths,
)
from aiayn.inference.runtimes import DecodeOptions, EagerDecoder
from aiayn.model import Transformer
from support.model_wrappers import LogitBias

VOCAB = 40


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> Transformer:
    """Tiny random model (GQA, 2+2 layers) in float64; EOS made likelier so lengths vary."""
    torch.manual_seed(0)
    cfg = model_preset("tiny", vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2,
                       max_positions=128, attention_backend="sdpa")  # fmt: skip
    m = Transformer(cfg).double().eval()
    with torch.no_grad():
        m.tgt_embed.weight[EOS_ID] *= 3.0
    return m


def padded_batch(lengths: list[int], seed: int) -> torch.Tensor:
    """(B, max(lengths)) random source ids in [4, VOCAB), right-padded with PAD."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD_ID)
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(4, VOCAB, (n,), generator=gen)
    return src


# ---------------------------------------------------------------- reference implementations


def reference_beam(model, src_row: torch.Tensor, *, beam_size: int, alpha: float, max_len: int) -> list[Hypothesis]:
    """One sentence, no cache, plain Python lists: fairseq's rules (see aiayn.inference.search) spelled out."""
    memory, mask = model.encode(src_row[None])
    beams = [([BOS_ID], 0.0)]
    finished: list[Hypothesis] = []
    for step in range(max_len + 1):
        cands = []
        for toks, score in beams:
            with torch.no_grad():
                logits = model.decode(torch.tensor([toks]), memory, mask)[0, -1]
            lp = torch.log_softmax(logits.double(), -1).tolist()
            for tok, l in enumerate(lp):
                if tok in (PAD_ID, BOS_ID, UNK_ID) or (step == 0 and tok == EOS_ID) or (step == max_len and tok != EOS_ID):
                    continue
                cands.append((score + l, toks, tok))
        cands.sort(key=lambda c: -c[0])
        cands = cands[: 2 * beam_size]
        for rank, (s, toks, tok) in enumerate(cands[:beam_size]):
            if tok == EOS_ID and len(finished) < beam_size:
                finished.append(Hypothesis(toks[1:], s / ((5 + len(toks)) / 6) ** alpha, s))
        beams = [(toks + [tok], s) for s, toks, tok in cands if tok != EOS_ID][:beam_size]
        if len(finished) >= beam_size or step == max_len:
            break
    return sorted(finished, key=lambda h: -h.score)


def teacher_forced_logprob(model, src_row: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + EOS | src) by one teacher-forced forward pass."""
    tgt = torch.tensor([[BOS_ID] + tokens])
    with torch.no_grad():
        lp = torch.log_softmax(model(src_row[None], tgt)[0].double(), -1)  # (T, V)
    return sum(lp[t, y].item() for t, y in enumerate(tokens + [EOS_ID]))


# ---------------------------------------------------------------- real model


def test_max_output_lengths():
    src = padded_batch([3, 10, 1], seed=0)
    assert max_output_lengths(src, max_len_a=1.5, max_len_b=2).tolist() == [6, 17, 3]
    assert max_output_lengths(src, max_len_a=0.0, max_len_b=0).tolist() == [1, 1, 1]
    assert max_output_lengths(src, max_len_a=1.0, max_len_b=50, max_side_tokens=20).tolist() == [19, 19, 19]


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_cached_equals_full_recompute(model, decoder):
    src = padded_batch([7, 2, 11, 4], seed=1)
    if decoder == "greedy":
        run = lambda use_cache: greedy_decode(model, src, max_len_a=1.0, max_len_b=6, use_cache=use_cache)  # noqa: E731
    else:
        run = lambda use_cache: beam_search_hypotheses(  # noqa: E731
            model, src, beam_size=3, max_len_b=6, use_cache=use_cache
        )
    cached, full = run(True), run(False)
    if decoder == "beam":
        cached = [[(h.tokens, round(h.score, 9)) for h in hs] for hs in cached]
        full = [[(h.tokens, round(h.score, 9)) for h in hs] for hs in full]
    assert cached == full


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_sentence_alone_equals_inside_padded_batch(model, decoder):
    lengths = [1, 14, 3, 9]
    src = padded_batch(lengths, seed=2)
    kw = dict(max_len_a=1.0, max_len_b=4)
    decode = greedy_decode if decoder == "greedy" else (lambda m, s, **k: beam_search(m, s, beam_size=4, **k))
    batched = decode(model, src, **kw)
    alone = [decode(model, src[b : b + 1, :n], **kw)[0] for b, n in enumerate(lengths)]
    assert batched == alone
    assert len({len(t) for t in batched}) > 1  # outputs really differ in length


def test_beam_matches_reference_implementation(model):
    src = padded_batch([5, 1, 8], seed=3)
    lengths = [5, 1, 8]
    hyps = beam_search_hypotheses(model, src, beam_size=3, len_penalty=0.6, max_len_a=1.0, max_len_b=3)
    for b, n in enumerate(lengths):
        ref = reference_beam(model, src[b, :n], beam_size=3, alpha=0.6, max_len=n + 3)
        assert [h.tokens for h in hyps[b]] == [h.tokens for h in ref]
        for h, r in zip(hyps[b], ref):
            assert h.score == pytest.approx(r.score, abs=1e-9)


def test_beam_scores_equal_teacher_forced_logprob(model):
    src = padded_batch([6, 3], seed=4)
    for b, hs in enumerate(beam_search_hypotheses(model, src, beam_size=4, len_penalty=0.6, max_len_b=5)):
        assert len(hs) == 4
        for h in hs:
            lp = teacher_forced_logprob(model, src[b, : [6, 3][b]], h.tokens)
            assert h.logprob == pytest.approx(lp, abs=1e-9)
            assert h.score == pytest.approx(lp / ((5 + len(h.tokens) + 1) / 6) ** 0.6, abs=1e-9)


@pytest.mark.parametrize("eos_bias", [0.0, -1e4])  # outputs that end by themselves / are cut at the cap
def test_greedy_hypothesis_scores_equal_teacher_forced_logprob(model, eos_bias):
    """The greedy path scores its output like the beam search does."""
    lengths = [6, 3, 9]
    src = padded_batch(lengths, seed=7)
    decoder = LogitBias(model, {EOS_ID: eos_bias}).eval() if eos_bias else model  # eval: left in eval mode
    hyps = greedy_decode_hypotheses(decoder, src, max_len_b=5, len_penalty=0.6)
    assert [h.tokens for h in hyps] == greedy_decode(decoder, src, max_len_b=5)
    for b, h in enumerate(hyps):
        row = src[b, : lengths[b]][None]
        with torch.no_grad():
            logits = decoder.decode(torch.tensor([[BOS_ID] + h.tokens]), *decoder.encode(row))[0]  # (T, V)
        lp = torch.log_softmax(logits.double(), -1)[torch.arange(len(h.tokens) + 1), h.tokens + [EOS_ID]].sum().item()
        if not eos_bias:
            assert lp == pytest.approx(teacher_forced_logprob(model, row[0], h.tokens), abs=1e-9)
        assert h.logprob == pytest.approx(lp, abs=1e-9)
        assert h.score == pytest.approx(lp / ((5 + len(h.tokens) + 1) / 6) ** 0.6, abs=1e-9)


def test_eager_n_best_is_the_beam_search_and_its_first_is_translate_ids(model):
    lengths = [5, 2, 8]
    src = padded_batch(lengths, seed=8)
    sources = [src[b, :n].numpy() for b, n in enumerate(lengths)]
    dec = EagerDecoder(model)
    opts = DecodeOptions(beam_size=3, max_len_b=4)
    nbest = dec.translate_hyps(sources, opts, n_best=3)
    want = beam_search_hypotheses(model, src, beam_size=3, max_len_b=4)
    assert [[(h.tokens, h.score) for h in hs] for hs in nbest] == [[(h.tokens, h.score) for h in hs] for hs in want]
    assert [hs[0].tokens for hs in nbest] == dec.translate_ids(sources, opts)
    assert [len(hs) for hs in dec.translate_hyps(sources, opts, n_best=2)] == [2, 2, 2]
    with pytest.raises(ValueError, match="n_best must be from 1 to beam_size"):
        dec.translate_hyps(sources, opts, n_best=4)


def test_beam_size_one_is_greedy(model):
    src = padded_batch([4, 9, 2, 6], seed=5)
    assert beam_search(model, src, beam_size=1, max_len_b=5) == greedy_decode(model, src, max_len_b=5)


def test_outputs_respect_max_len_when_eos_never_wins(model):
    src = padded_batch([2, 7], seed=6)
    never_eos = LogitBias(model, {EOS_ID: -1e4})
    assert [len(t) for t in greedy_decode(never_eos, src, max_len_a=0.5, max_len_b=3)] == [4, 6]
    assert [len(t) for t in beam_search(never_eos, src, beam_size=2, max_len_a=0.5, max_len_b=3)] == [4, 6]


def test_finished_sentences_leave_the_batch(model):
    """Short (1 token, max_len 3) + long (20 tokens, max_len 22) source; EOS only when forced."""
    src = padded_batch([1, 20], seed=7)
    K = 3
    rec = LogitBias(model, {EOS_ID: -1e4})
    out = beam_search(rec, src, beam_size=K, max_len_a=1.0, max_len_b=2)
    assert [len(t) for t in out] == [3, 22]
    # step 0: one row per sentence; steps 1-3: both sentences x K beams; steps 4-22: the long one only.
    assert rec.batch_sizes == [2] + [2 * K] * 3 + [K] * 19
    rec = LogitBias(model, {EOS_ID: -1e4})
    out = greedy_decode(rec, src, max_len_a=1.0, max_len_b=2)
    assert [len(t) for t in out] == [3, 22]
    assert rec.batch_sizes == [2] * 4 + [1] * 19


def test_decoding_restores_training_mode(model):
    model.train()
    try:
        greedy_decode(model, padded_batch([3], seed=8), max_len_b=2)
        assert model.training
    finally:
        model.eval()


# ---------------------------------------------------------------- length penalty with a stub model


class StubCache:
    """Holds each row's full prefix; ``reorder`` is the only method decoding may use."""

    def __init__(self, batch_size: int):
        self.prefix = torch.empty(batch_size, 0, dtype=torch.long)

    def reorder(self, index: torch.Tensor, *, cross: bool = True) -> None:
        self.prefix = self.prefix.index_select(0, index)


class ConstantStepStub:
    """Every continuation the stub "wants" has log-probability log(1 / (2K)) (the constant per-token
    log-probability); the remaining mass is spread evenly over the other tokens.

    Step 0 wants the K tokens 4..4+K-1; a hypothesis starting with ``w`` then wants token 10
    until it holds ``w - 3`` tokens and EOS from then on: preferred lengths |Y| = 2, 3, ... (incl. EOS).
    """

    def __init__(self, K: int, V: int = 32):
        self.K, self.V = K, V
        self.p = 1.0 / (2 * K)

    def logprobs(self, prefix: list[int]) -> torch.Tensor:
        if prefix == [BOS_ID]:
            wanted = list(range(4, 4 + self.K))
        else:
            wanted = [EOS_ID] if len(prefix) - 1 >= prefix[1] - 3 else [10]
        rest = (1.0 - self.p * len(wanted)) / (self.V - len(wanted))
        probs = torch.full((self.V,), rest, dtype=torch.float64)
        probs[wanted] = self.p
        return probs.log()

    def encode(self, src):
        return torch.zeros(*src.shape, 1, dtype=torch.float64), src.eq(PAD_ID)

    def new_kv_cache(self, batch_size, max_len):
        return StubCache(batch_size)

    def decode(self, tgt_in, memory, src_pad_mask, *, kv_cache=None):
        if kv_cache is not None:
            kv_cache.prefix = torch.cat([kv_cache.prefix, tgt_in], dim=1)
            tgt_in = kv_cache.prefix
        return torch.stack([self.logprobs(row) for row in tgt_in.tolist()])[:, None]  # (B, 1, V)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 3.0])
@pytest.mark.parametrize("use_cache", [True, False])
def test_length_penalty_scores_follow_gnmt_formula(alpha, use_cache):
    K = 4
    stub = ConstantStepStub(K)
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, PAD_ID, PAD_ID]])
    all_hyps = beam_search_hypotheses(stub, src, beam_size=K, len_penalty=alpha, max_len_b=10, use_cache=use_cache)
    c = math.log(1.0 / (2 * K))
    for hyps in all_hyps:
        assert len(hyps) == K
        by_tokens = {tuple(h.tokens): h for h in hyps}
        # The "wanted" hypotheses of |Y| = 2, 3, 4 always finish; each token has log-probability c.
        for toks in [(4,), (5, 10), (6, 10, 10)]:
            n = len(toks) + 1
            assert by_tokens[toks].score == pytest.approx(n * c / ((5 + n) / 6) ** alpha, abs=1e-12)
        for h in hyps:  # every finished hypothesis, also those through a non-wanted token
            prefix, logprob = [BOS_ID], 0.0
            for tok in h.tokens + [EOS_ID]:
                logprob += stub.logprobs(prefix)[tok].item()
                prefix.append(tok)
            n = len(h.tokens) + 1
            assert h.logprob == pytest.approx(logprob, abs=1e-12)
            assert h.score == pytest.approx(logprob / length_penalty(n, alpha), abs=1e-12)
            assert length_penalty(n, alpha) == ((5 + n) / 6) ** alpha
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    best = beam_search(stub, src, beam_size=K, len_penalty=alpha, max_len_b=10, use_cache=use_cache)
    assert best == [hyps[0].tokens for hyps in all_hyps]
    if alpha == 0.0:
        assert best == [[4], [4]]  # no normalisation: the shortest wanted hypothesis has the best log-probability


def test_bad_arguments_raise(model):
    src = padded_batch([3], seed=9)
    with pytest.raises(ValueError, match="beam_size must be >= 1, got 0"):
        beam_search(model, src, beam_size=0)
    with pytest.raises(ValueError, match="vocabulary of at least 42"):
        beam_search(model, src, beam_size=21)
    with pytest.raises(ValueError, match="src must be"):
        greedy_decode(model, src[0])


def test_greedy_scores_follow_the_length_norm_the_beam_uses(model):
    """With ``length_norm="fairseq"`` the greedy score is ``logprob / |Y+1| ** a``
    (as the beam search scores), not GNMT's; an unknown norm is refused before any work."""
    src = padded_batch([6, 3], seed=9)
    gnmt = greedy_decode_hypotheses(model, src, max_len_b=5, len_penalty=0.6)
    fairseq = greedy_decode_hypotheses(model, src, max_len_b=5, len_penalty=0.6, length_norm="fairseq")
    for g, f in zip(gnmt, fairseq):
        assert f.tokens == g.tokens and f.logprob == g.logprob
        assert f.score == pytest.approx(f.logprob / (len(f.tokens) + 1) ** 0.6, abs=1e-9)
    with pytest.raises(ValueError, match="length_norm"):
        greedy_decode_hypotheses(model, src, length_norm="nope")
