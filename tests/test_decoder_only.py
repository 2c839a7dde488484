"""``ModelConfig.arch='decoder_only'``: one causal stack over ``[source, EOS, BOS, target]``.

Shapes and parameter counts, target-only loss masking, padding invariance for every ``positions``
value (each row left-padded with its own position ids), cache vs. full recompute (step logits, greedy
and beam search), GQA, the Triton fallback, the CTranslate2 refusal (and the quantize stage skipping
its ct2 variants), and training with exact resume and checkpoint averaging.

Tolerances: float32 comparisons use atol 1e-5 (values are O(1); summation order differs between batch
shapes), float64 decoding compares token lists and scores rounded to 1e-9.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
import torch

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, ModelConfig, model_preset
from aiayn.inference.search import beam_search, beam_search_hypotheses, greedy_decode
from aiayn.model import Transformer
from aiayn.model.kv_cache import cache_bytes, cache_bytes_per_token
from aiayn.model.transformer import DecoderOnlyLayer
from aiayn.train import label_smoothed_cross_entropy

F32_ATOL = 1e-5
POSITIONS = ["sinusoidal", "learned", "rope", "alibi"]


pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_positions=128,
                attention_backend="sdpa", arch="decoder_only")  # fmt: skip
    return model_preset("tiny", **{**base, **overrides})


def model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg(**overrides)).eval()


def right_padded(gen: torch.Generator, lengths: list[int], width: int | None = None, vocab: int = 50) -> torch.Tensor:
    """``(B, width)`` random ids in [4, vocab), right-padded with PAD to ``lengths``."""
    x = torch.randint(4, vocab, (len(lengths), width or max(lengths)), generator=gen)
    for b, n in enumerate(lengths):
        x[b, n:] = PAD_ID
    return x


def src_batch(gen: torch.Generator, lengths: list[int], width: int | None = None) -> torch.Tensor:
    """Sources as ``aiayn.data.batching.collate`` makes them: tokens, EOS, right padding."""
    x = right_padded(gen, lengths, width)
    for b, n in enumerate(lengths):
        x[b, n - 1] = EOS_ID
    return x


def tgt_batch(gen: torch.Generator, lengths: list[int], width: int | None = None) -> torch.Tensor:
    """``tgt_in`` as collate makes it: BOS, tokens, right padding."""
    x = right_padded(gen, lengths, width)
    x[:, 0] = BOS_ID
    return x


# ---------------------------------------------------------------- config, shapes, parameters


def test_default_is_the_encoder_decoder():
    assert ModelConfig().arch == "encoder_decoder"
    paper = Transformer(model_preset("tiny", vocab_size=50), device="meta")
    assert not paper.decoder_only and len(paper.encoder_layers) == len(paper.decoder_layers) == 3
    assert paper.max_side_tokens == paper.cfg.max_positions
    with pytest.raises(ValueError):
        ModelConfig(arch="encoder_only")


@pytest.mark.parametrize("preset", ["tiny", "base", "big"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_depth_and_parameter_count(preset, norm):
    """``2 * n_layers`` self-attention + FFN layers: the encoder-decoder's parameters minus its
    ``n_layers`` cross-attention blocks (4 projections + a norm) and, pre-norm, the encoder's final norm;
    with ``d_ff + d_model`` the FFNs make up for them (within 0.1 %)."""
    ed = Transformer(model_preset(preset, norm=norm), device="meta")
    do = Transformer(model_preset(preset, norm=norm, arch="decoder_only"), device="meta")
    c = ed.cfg
    assert len(do.encoder_layers) == 0 and len(do.decoder_layers) == 2 * c.n_layers
    assert all(isinstance(layer, DecoderOnlyLayer) and not hasattr(layer, "cross_attn") for layer in do.decoder_layers)
    cross = 4 * (c.d_model * c.d_model + c.d_model) + 2 * c.d_model  # q, k, v, out (+ biases) and its LayerNorm
    final_norm = 2 * c.d_model if norm == "pre" else 0
    assert do.num_parameters() == ed.num_parameters() - c.n_layers * cross - final_norm
    wider = Transformer(model_preset(preset, norm=norm, arch="decoder_only", d_ff=c.d_ff + c.d_model), device="meta")
    assert abs(wider.num_parameters() - ed.num_parameters()) / ed.num_parameters() < 1e-3


def test_shapes_and_shared_position_range():
    gen = torch.Generator().manual_seed(1)
    m = model(max_positions=40)
    assert m.max_side_tokens == m.cfg.max_side_tokens == 20  # source and target share one range
    src, tgt = src_batch(gen, [7, 3]), tgt_batch(gen, [5, 5])
    with torch.no_grad():
        memory, mask = m.encode(src)
        assert memory.shape == (2, 7, 32) and mask.shape == (2, 7)
        assert mask.tolist()[1] == [True] * 4 + [False] * 3  # padding moved to the left
        assert m(src, tgt).shape == (2, 5, 50)  # logits for the target positions only
        m(src_batch(gen, [20]), tgt_batch(gen, [20]))  # 40 stream positions: fits
        with pytest.raises(ValueError, match="max_positions=40"):
            m(src_batch(gen, [21]), tgt_batch(gen, [20]))


# ---------------------------------------------------------------- target-only loss


def test_target_only_loss_masking():
    """The loss reaches no source position: the stack's output at source positions gets exactly zero
    gradient (no prediction is made there), and neither does a PAD target's; the source still matters
    (changing it changes the target logits; its embeddings get gradient); PAD targets add nothing."""
    gen = torch.Generator().manual_seed(2)
    m = model(dropout=0.0).train()
    src, tgt_in = src_batch(gen, [6, 4]), tgt_batch(gen, [5, 3])
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((2, 1), PAD_ID)], dim=1)
    tgt_out[0, 4], tgt_out[1, 2] = EOS_ID, EOS_ID  # row 1: targets at 0..2, PAD at 3, 4
    kept = {}

    def keep(module, inputs, out):  # returns None: the output is left as it is
        out.retain_grad()
        kept["h"] = out

    handle = m.decoder_layers[-1].register_forward_hook(keep)
    logits = m(src, tgt_in)
    handle.remove()
    assert logits.shape == (2, 5, 50)
    loss, _, n = label_smoothed_cross_entropy(logits, tgt_out, label_smoothing=0.1)
    assert n == 5 + 3
    loss.backward()
    grad = kept["h"].grad  # (B, S + T, d_model), the last layer's output over the whole stream
    S = src.shape[1]
    assert grad.shape == (2, S + 5, 32)
    assert torch.all(grad[:, :S] == 0)  # no loss term at any source position
    assert torch.all(grad[1, S + 3 :] == 0)  # nor at PAD targets
    assert all(grad[b, S + t].abs().sum() > 0 for b, t in [(0, 0), (0, 4), (1, 0), (1, 2)])
    assert m.src_embed.weight.grad[src[0, 0]].abs().sum() > 0  # the source is attended to
    with torch.no_grad():
        m.eval()
        other = src.clone()
        other[0, 0] = 5 if src[0, 0] != 5 else 6
        assert not torch.allclose(m(other, tgt_in)[0], m(src, tgt_in)[0], atol=1e-3)
        padded_in = torch.cat([tgt_in, torch.full((2, 3), PAD_ID)], dim=1)
        padded_out = torch.cat([tgt_out, torch.full((2, 3), PAD_ID)], dim=1)
        a = label_smoothed_cross_entropy(m(src, tgt_in), tgt_out, label_smoothing=0.1)[0]
        b = label_smoothed_cross_entropy(m(src, padded_in), padded_out, label_smoothing=0.1)[0]
        torch.testing.assert_close(a, b, atol=F32_ATOL, rtol=0)


# ---------------------------------------------------------------- padding invariance


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_sentence_alone_equals_inside_a_batch_with_a_much_longer_one(positions, backend):
    """Left padding inside the model + per-row positions: a 3-token source next to a 30-token one (27
    pads), and its 2-token target next to a 9-token one, gives the same target logits as alone."""
    gen = torch.Generator().manual_seed(3)
    m = model(positions=positions, attention_backend=backend, norm="pre")
    src, tgt = src_batch(gen, [30, 3]), tgt_batch(gen, [9, 2])
    with torch.no_grad():
        both = m(src, tgt)
        alone = m(src[1:, :3], tgt[1:, :2])
        torch.testing.assert_close(both[1:, :2], alone, atol=F32_ATOL, rtol=0)
        torch.testing.assert_close(both[:1], m(src[:1], tgt[:1]), atol=F32_ATOL, rtol=0)
        # extra padding columns on both sides change nothing either
        wide = m(torch.cat([src, torch.full((2, 5), PAD_ID)], 1), torch.cat([tgt, torch.full((2, 4), PAD_ID)], 1))
        torch.testing.assert_close(wide[:, :9], both, atol=F32_ATOL, rtol=0)


def test_per_row_positions_continue_from_each_source():
    """Row positions: pads 0 (masked), the source 0 .. len - 1, the target from len on."""
    n_pad = torch.tensor([0, 27])
    pos = Transformer._stream_positions(n_pad, 0, 32)  # S = 30, then 2 target tokens
    assert pos[0].tolist() == list(range(32))
    assert pos[1].tolist() == [0] * 27 + [0, 1, 2, 3, 4]
    assert Transformer._stream_positions(n_pad, 31, 1).tolist() == [[31], [4]]


# ---------------------------------------------------------------- KV cache


DECODE_VARIANTS = [
    {}, {"positions": "learned"}, {"positions": "rope"}, {"positions": "alibi"}, {"n_kv_heads": 1},
    {"n_kv_heads": None, "attention_backend": "reference"}, {"share_embeddings": False},
    {"positions": "rope", "norm": "pre", "norm_type": "rmsnorm", "activation": "swiglu", "n_kv_heads": 1},
    {"positions": "alibi", "n_heads": 8, "n_kv_heads": 2, "norm": "pre"},
]  # fmt: skip


@pytest.mark.parametrize("overrides", DECODE_VARIANTS)
def test_cached_decode_matches_full_recompute(overrides):
    """The first cached call prefills the source (+ 2 target tokens), then 1 token a step: the step
    logits equal the teacher-forced ones; the cache holds ``2 * n_layers`` layers of ``n_kv_heads``
    heads over source + target."""
    gen = torch.Generator().manual_seed(6)
    m = model(**overrides)
    src, tgt = src_batch(gen, [7, 2, 5]), tgt_batch(gen, [6, 6, 6])
    with torch.no_grad():
        memory, src_pad_mask = m.encode(src)
        full = m.decode(tgt, memory, src_pad_mask)  # (3, 6, V)
        cache = m.new_kv_cache(3, 8)
        steps = [m.decode(tgt[:, :2], memory, src_pad_mask, kv_cache=cache)]
        steps += [m.decode(tgt[:, t : t + 1], None, None, kv_cache=cache) for t in range(2, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=F32_ATOL, rtol=0)
    c = m.cfg
    assert cache.n_layers == 2 * c.n_layers and cache.prefix_len == 7 and cache.length == 7 + 6
    assert cache.k_cache[0].shape == (3, c.kv_heads, 7 + 8, c.head_dim)
    assert cache.cross_nbytes == 0 and cache.src_pad_mask.tolist()[1] == [True] * 5 + [False] * 2
    assert cache.self_nbytes == cache_bytes(c, batch_size=3, tgt_len=8, src_len=7)
    assert cache_bytes(c, batch_size=3, tgt_len=8, src_len=7) == 2 * c.n_layers * 3 * 15 * cache_bytes_per_token(c)
    with pytest.raises(ValueError, match="KVCache full"):
        m.decode(torch.full((3, 3), 5), None, None, kv_cache=cache)


@pytest.fixture(scope="module")
def f64_model() -> Transformer:
    """Tiny decoder-only model (GQA, rope, 2 x 2 layers) in float64; EOS made likelier so lengths vary."""
    m = model(seed=0, positions="rope").double()
    with torch.no_grad():
        m.tgt_embed.weight[EOS_ID] *= 3.0
    return m


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_decoding_cache_equals_recompute_and_batching(f64_model, decoder):
    """Greedy and beam search (``KVCache.reorder`` moves the cached source prefix with the beams): the
    cached and recomputing decoders agree, and a sentence alone decodes as in a padded batch."""
    gen = torch.Generator().manual_seed(1)
    lengths = [7, 2, 11, 4]
    src = src_batch(gen, lengths)

    def run(s: torch.Tensor, use_cache: bool) -> list:
        if decoder == "greedy":
            return greedy_decode(f64_model, s, max_len_a=1.0, max_len_b=6, use_cache=use_cache)
        hyps = beam_search_hypotheses(f64_model, s, beam_size=3, max_len_b=6, use_cache=use_cache)
        return [[(h.tokens, round(h.score, 9)) for h in hs] for hs in hyps]

    cached, full = run(src, True), run(src, False)
    assert cached == full
    assert [run(src[b : b + 1, :n], True)[0] for b, n in enumerate(lengths)] == cached
    if decoder == "greedy":
        assert len({len(t) for t in cached}) > 1  # outputs really differ in length


def test_beam_search_matches_the_reference_implementation(f64_model):
    from test_decode import reference_beam

    gen = torch.Generator().manual_seed(3)
    lengths = [5, 1, 8]
    src = src_batch(gen, lengths)
    hyps = beam_search_hypotheses(f64_model, src, beam_size=3, len_penalty=0.6, max_len_a=1.0, max_len_b=5)
    for b, n in enumerate(lengths):
        ref = reference_beam(f64_model, src[b, :n], beam_size=3, alpha=0.6, max_len=n + 5)
        assert [(h.tokens, round(h.score, 9)) for h in hyps[b]] == [(h.tokens, round(h.score, 9)) for h in ref]
    assert beam_search(f64_model, src, beam_size=1, max_len_b=5) == greedy_decode(f64_model, src, max_len_b=5)


def test_gqa_with_n_kv_heads_equal_to_n_heads_is_mha_exactly():
    gen = torch.Generator().manual_seed(16)
    mha, gqa = model(seed=3, n_kv_heads=None), model(seed=3, n_kv_heads=4)
    assert all(torch.equal(a, b) for a, b in zip(gqa.state_dict().values(), mha.state_dict().values()))
    src, tgt = src_batch(gen, [8, 3, 6]), tgt_batch(gen, [6, 6, 6])
    with torch.no_grad():
        assert torch.equal(gqa(src, tgt), mha(src, tgt))
    mqa = model(seed=3, n_kv_heads=1)
    assert mqa.new_kv_cache(3, 4).k_cache[0].shape == (3, 1, 4, 8)


def test_triton_backend_falls_back_to_sdpa(caplog):
    with caplog.at_level(logging.INFO, logger="aiayn"):
        m = model(attention_backend="triton")
    assert m.attention_backend == "sdpa"
    assert "arch='decoder_only' left-pads the source" in caplog.text
    assert model(attention_backend="triton", arch="encoder_decoder").attention_backend == "triton"


# ---------------------------------------------------------------- CTranslate2 and the quantize stage


def test_ctranslate2_refuses_decoder_only_by_name(tmp_path, monkeypatch):
    """The converter names ``arch``; the quantize stage marks every CTranslate2 variant skipped with
    that reason and still measures the eager model."""
    from support import tiny
    from aiayn.config.schema import params_from_dict
    from aiayn.export.ctranslate2 import UnsupportedModelError, check_supported
    from aiayn.stages import quantize as stage

    with pytest.raises(UnsupportedModelError, match="arch='decoder_only'"):
        check_supported(cfg(n_kv_heads=None, positions="sinusoidal"))
    monkeypatch.setenv("AIAYN_TRACKING", "0")
    real_model = tiny.model
    monkeypatch.setattr(tiny, "model", lambda tok, **kw: real_model(tok, arch="decoder_only", **kw))
    tok = tiny.tokenizer(tmp_path)
    layout = tiny.project(tmp_path / "p", tok)
    assert json.loads((layout.model / "model.json").read_text())["model"]["arch"] == "decoder_only"
    params = params_from_dict({
        "data": {"test_splits": ["test_a", "test_b"]},
        "evaluate": {"beam_size": 1, "max_len_b": 8},
        "quantize": {"gate_split": "test_a", "variants": ["ct2-int8"], "calibration_sentences": 8,
                     "throughput": False, "layer_attribution": False},
    })  # fmt: skip
    summary = stage.run(params, layout)
    report = json.loads((layout.quantized / "report.json").read_text())
    for name in ("ct2-float32", "ct2-int8"):
        assert summary[name]["status"] == "skipped"
        assert "not convertible to CTranslate2" in report["variants"][name]["reason"]
        assert "ModelConfig.arch='decoder_only'" in report["variants"][name]["reason"]
    assert summary["serving_default"] is None


# ---------------------------------------------------------------- training, resume, averaging


def test_training_decreases_loss_resumes_exactly_and_averages(tmp_path):
    from test_train import assert_bitwise_equal, synthetic_split, weights
    from test_train import MODEL as ED_MODEL
    from test_train import cfg as train_cfg

    from aiayn.data.batching import EpochBatchIterator
    from aiayn.train import averaged_weights, train

    model_cfg = ED_MODEL.model_copy(update={"arch": "decoder_only"})
    split = synthetic_split()
    per_epoch = EpochBatchIterator(split, max_tokens=64, data_seed=5).batches_in_epoch
    k, total = per_epoch // 2, per_epoch + 4
    full = train(model_cfg, train_cfg(max_steps=total, checkpoint_every=2), split, None, tmp_path / "full")
    assert isinstance(full.model.decoder_layers[0], DecoderOnlyLayer)
    losses = [full.losses[s] for s in range(1, total + 1)]
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1, losses

    first = train(model_cfg, train_cfg(max_steps=k, checkpoint_every=2), split, None, tmp_path / "resumed")
    assert first.step == k
    torch.manual_seed(12345)  # a resumed process starts with unrelated RNG state
    second = train(model_cfg, train_cfg(max_steps=total, checkpoint_every=2), split, None, tmp_path / "resumed")
    assert second.resumed_from == k
    assert second.losses == full.losses
    assert_bitwise_equal(weights(second.model), weights(full.model))

    avg, steps = averaged_weights(tmp_path / "full", 2)
    assert len(steps) == 2
    averaged = Transformer(model_cfg)
    averaged.load_state_dict(avg)  # an ordinary state dict: the same keys and shapes
    with torch.no_grad():
        assert torch.isfinite(averaged.eval()(torch.tensor([[5, 6, EOS_ID]]), torch.tensor([[BOS_ID, 7]]))).all()
