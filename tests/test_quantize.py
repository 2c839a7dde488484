"""Quantize stage: converter round trip (post/pre-norm), int8 error bound, refusals, decoding rules,
the quality gate and the stage end to end, on small randomly-initialised models (CPU, 1 thread)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
import torch

from aiayn.config.schema import EOS_ID, ModelConfig, params_from_dict
from aiayn.inference.search import max_output_lengths
from aiayn.inference.runtimes import CT2Decoder, DecodeOptions, EagerDecoder
from aiayn.data.batching import pad_batch
from aiayn.quantize.gate import REJECTED, degenerate_lines, gate, max_run
from aiayn.export.ctranslate2 import AiaynConverter, UnsupportedModelError, check_supported
from aiayn.quantize.fake_quant import fake_quantize_int8
from aiayn.quantize.int8 import ACCUMULATIONS, int8_accumulation, int8_logprobs
from aiayn.stages import Layout
from aiayn.tokenizer import Tokenizer
from aiayn.inference.translator import Translator

from support import tiny
from support.strict import host_class_skip


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return tiny.tokenizer(tmp_path_factory.mktemp("spm"))


_corpus, _model = tiny.corpus, tiny.model


def _ct2(model, tok, tmp_path, quantization="float32", name="ct2") -> CT2Decoder:
    AiaynConverter(model, tok).convert(str(tmp_path / name), quantization=quantization, force=True)
    return CT2Decoder(tmp_path / name, tok, max_side_tokens=model.max_side_tokens, compute_type=quantization)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_converter_round_trip_scores_match_ours(tok, tmp_path, norm):
    """Teacher-forced CTranslate2 log-probs equal ours per token (catches a mis-ordered sinusoid table
    or a wrong pre/post-norm mapping), and greedy output is identical token for token."""
    model = _model(tok, norm=norm)
    ct = _ct2(model, tok, tmp_path)
    en, de = _corpus(24, 1)
    srcs = Translator(tok, EagerDecoder(model)).encode(en)
    tgts = tok.encode(de)
    for ours, theirs in zip(EagerDecoder(model).score_ids(srcs, tgts), ct.score_ids(srcs, tgts)):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(theirs, ours, atol=1e-4)
    opts = DecodeOptions(beam_size=1, max_len_b=8)
    assert ct.translate_ids(srcs, opts) == EagerDecoder(model).translate_ids(srcs, opts)


def test_misordered_sinusoid_table_is_caught_by_the_score_check(tok, tmp_path):
    """CTranslate2's own sinusoid layout (sin half | cos half) instead of ours (interleaved) drifts."""
    model = _model(tok)
    spec = AiaynConverter(model, tok)._load()
    table = spec.encoder.position_encodings.encodings
    concat = np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    spec.encoder.position_encodings.encodings = concat
    spec.decoder.position_encodings.encodings = concat
    spec.validate()
    spec.optimize(quantization="float32")
    (tmp_path / "own").mkdir()
    spec.save(str(tmp_path / "own"))
    ct = CT2Decoder(tmp_path / "own", tok, max_side_tokens=model.max_side_tokens)
    en, de = _corpus(8, 2)
    srcs, tgts = Translator(tok, EagerDecoder(model)).encode(en), tok.encode(de)
    gap = max(np.abs(a - b).max() for a, b in zip(EagerDecoder(model).score_ids(srcs, tgts), ct.score_ids(srcs, tgts)))
    assert gap > 1e-2


def test_int8_weight_round_trip_error_bounded(tok, tmp_path):
    """CTranslate2's int8 model computes exactly the int8 arithmetic this host's GEMM does
    (``aiayn.quantize.int8``), so the only difference left is float32 rounding of the dequantized
    sums and the softmax: 1e-4 nats, the converter's own float32 tolerance above. Which int8
    arithmetic runs depends on the CPU (VNNI sums products exactly; oneDNN without VNNI saturates
    pairs of products in int16: a 2.07-nat gap on this random model, 0.05 exact), so the test asks
    the host rule which one to expect instead of bounding the gap to float by one host's figure."""
    model = _model(tok)
    w = model.encoder_layers[0].ffn.w1.weight.detach()
    err = (fake_quantize_int8(w) - w).abs()
    bound = w.abs().amax(dim=1, keepdim=True) / 127 / 2  # half a quantization step per row
    assert bool((err <= bound + 1e-7).all())
    ct8 = _ct2(model, tok, tmp_path, "int8", "i8")
    en, de = _corpus(8, 3)
    srcs, tgts = Translator(tok, EagerDecoder(model)).encode(en), tok.encode(de)
    got = ct8.score_ids(srcs, tgts)

    def gap(kind: str) -> float:
        return max(np.abs(a - b).max() for a, b in zip(int8_logprobs(model, srcs, tgts, accumulation=kind), got))

    host = int8_accumulation()
    expected = [host["accumulation"]] if host["accumulation"] in ACCUMULATIONS else list(ACCUMULATIONS)
    # 1e-4: the converter's float32 tolerance (test_converter_round_trip_scores_match_ours), what is left once
    # the int8 sums are the same; measured 9.4e-7 nats here (AMD EPYC, oneDNN without VNNI: int16-saturating)
    assert min(gap(kind) for kind in expected) < 1e-4, (host, {k: gap(k) for k in ACCUMULATIONS})
    # the reference's exact arithmetic stays within int8's rounding of float: per layer at most half a
    # step of each weight and activation. Measured 0.049 nats end to end on this model; both sides are
    # computed by torch here, not by a host's int8 kernel, so that holds on any host up to float32
    # rounding (~1e-6). Bound 0.1: 2x the measured gap; 0 < : the two really differ
    exact_vs_float = max(np.abs(a - b).max() for a, b in zip(
        int8_logprobs(model, srcs, tgts, accumulation="exact"), EagerDecoder(model).score_ids(srcs, tgts)))
    assert 0 < exact_vs_float < 0.1


@pytest.mark.parametrize("env, isa, want", [
    ({}, ("avx2", "avx512f", "avx512_vnni"), "exact"),
    ({"MKL_CBWR": "AUTO"}, ("avx2", "avx512f", "avx512_vnni"), "exact"),
    ({"MKL_CBWR": "AVX512"}, ("avx2", "avx512f", "avx512_vnni"), "exact"),
    ({"MKL_CBWR": "AVX2"}, ("avx2", "avx512f", "avx512_vnni"), "int16-saturating"),
    ({"MKL_CBWR": "AVX2,STRICT"}, ("avx2", "avx512f", "avx512_vnni"), "int16-saturating"),
    ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, ("avx2", "avx512f", "avx512_vnni"), "int16-saturating"),
    ({"MKL_CBWR": "COMPATIBLE"}, ("avx2", "avx512f", "avx512_vnni"), "unknown"),
    ({}, ("avx2", "fma"), "int16-saturating"),
    ({}, ("avx2", "avx512f"), "unknown"),
])
def test_the_host_rule_follows_what_mkl_is_allowed_on_intel(env, isa, want):
    """MKL held to AVX2 runs its vpmaddubsw kernel even on a VNNI Xeon (measured: the round-trip test below
    under ``MKL_CBWR=AVX2`` matched the saturating reference to 1e-6 and missed the exact one by 2.09 nats),
    which is also what an Intel CPU without AVX-512 or VNNI runs. The rule said ``exact`` there before."""
    import os
    from unittest import mock

    from aiayn.host import HostInfo

    intel = HostInfo("Intel(R) Xeon(R)", "GenuineIntel", isa, 2, 0.0)
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch("aiayn.quantize.int8.host_info", return_value=intel), \
            mock.patch("aiayn.quantize.int8.os.uname", return_value=mock.Mock(machine="x86_64")):
        got = int8_accumulation()
    assert (got["backend"], got["accumulation"]) == ("mkl", want), got


def test_int8_saturating_path_is_what_onednn_computes_without_vnni(tok, tmp_path):
    """``ONEDNN_MAX_CPU_ISA=AVX2`` makes oneDNN compute like an AVX2-only CPU on any x86 host with AVX2:
    CTranslate2 (run in a subprocess with oneDNN forced and capped) then equals the saturating
    reference to float32 rounding, the host rule says so, and the gap to the exact arithmetic is
    real (so the two references are not the same function)."""
    import subprocess
    import sys

    from aiayn.host import host_info

    if "avx2" not in host_info(probe=False).isa:
        host_class_skip("needs an x86 CPU with AVX2 (oneDNN's AVX2 int8 kernel)")
    model = _model(tok)
    _ct2(model, tok, tmp_path, "int8", "i8")
    en, de = _corpus(8, 3)
    srcs, tgts = Translator(tok, EagerDecoder(model)).encode(en), tok.encode(de)
    np.save(tmp_path / "srcs.npy", np.array(srcs, dtype=object), allow_pickle=True)
    np.save(tmp_path / "tgts.npy", np.array(tgts, dtype=object), allow_pickle=True)
    code = f"""
import json, numpy as np
from aiayn.inference.runtimes import CT2Decoder
from aiayn.quantize.int8 import int8_accumulation
from aiayn.tokenizer import Tokenizer
tok = Tokenizer.load({str(tok.source)!r})
ct = CT2Decoder({str(tmp_path / "i8")!r}, tok, max_side_tokens={model.max_side_tokens}, compute_type="int8")
srcs = list(np.load({str(tmp_path / "srcs.npy")!r}, allow_pickle=True))
tgts = [list(t) for t in np.load({str(tmp_path / "tgts.npy")!r}, allow_pickle=True)]
print(json.dumps({{"host": int8_accumulation(), "scores": [s.tolist() for s in ct.score_ids(srcs, tgts)]}}))
"""
    env = {**os.environ, "CT2_USE_MKL": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["host"]["accumulation"] == "int16-saturating"
    got = [np.asarray(s) for s in out["scores"]]
    sat = int8_logprobs(model, srcs, tgts, accumulation="int16-saturating")
    exact = int8_logprobs(model, srcs, tgts, accumulation="exact")
    assert max(np.abs(a - b).max() for a, b in zip(sat, got)) < 1e-4
    assert max(np.abs(a - b).max() for a, b in zip(exact, got)) > 1e-2


def test_int8_with_float16_storage_is_smaller_and_decodes_like_int8(tok, tmp_path):
    """ct2-int8 stores the non-int8 tensors (position table, biases, LayerNorm) in float16; CTranslate2
    widens them at load on CPU: the file shrinks, the scores move by float16 rounding only."""
    from aiayn.quantize.variants import VARIANTS, dir_bytes

    model = _model(tok)
    i8 = _ct2(model, tok, tmp_path, "int8", "i8")
    AiaynConverter(model, tok).convert(str(tmp_path / "i8h"), quantization=VARIANTS["ct2-int8"].storage, force=True)
    i8h = CT2Decoder(tmp_path / "i8h", tok, max_side_tokens=model.max_side_tokens, compute_type="int8")
    table = model.cfg.max_positions * model.cfg.d_model  # float32 -> float16 saves 2 bytes per entry (at least)
    assert dir_bytes(tmp_path / "i8") - dir_bytes(tmp_path / "i8h") >= 2 * table
    en, de = _corpus(8, 3)
    srcs, tgts = Translator(tok, EagerDecoder(model)).encode(en), tok.encode(de)
    gap = max(np.abs(a - b).max() for a, b in zip(i8.score_ids(srcs, tgts), i8h.score_ids(srcs, tgts)))
    # float16 rounding (2^-11 relative) of biases, LayerNorm and positions (d_model 32, random weights), carried
    # through the int8 GEMMs: measured 0.032 nats here (oneDNN without VNNI, int16-saturating sums). The
    # exact-sum path (VNNI) was not measured; a saturating pair can amplify a small change, so the bound
    # keeps ~5x the measured gap: 0.15. 0 < : float16 storage really ran
    assert 0 < gap < 0.15


@pytest.mark.parametrize("beam", [1, 3])
def test_parallel_workers_decode_exactly_like_one(tok, tmp_path, beam):
    """``inter_threads=2`` decodes batches in parallel (asynchronous submission); outputs and their
    order equal one worker's."""
    model = _model(tok)
    _ct2(model, tok, tmp_path)
    en, _ = _corpus(40, 5)
    srcs = Translator(tok, EagerDecoder(model)).encode(en)
    opts = DecodeOptions(beam_size=beam, max_len_a=1.0, max_len_b=5)
    one = CT2Decoder(tmp_path / "ct2", tok, max_side_tokens=model.max_side_tokens).translate_ids(srcs, opts, batch_size=4)
    two = CT2Decoder(tmp_path / "ct2", tok, max_side_tokens=model.max_side_tokens, inter_threads=2)
    assert two.translate_ids(srcs, opts, batch_size=4) == one
    if beam == 1:  # greedy: exactly the eager decoder's output too
        assert one == EagerDecoder(model).translate_ids(srcs, opts)


@pytest.mark.parametrize("beam, eos", [(1, 4.0), (1, 1.0), (4, 4.0), (4, 1.0)])
def test_n_best_scores_are_the_eager_decoder_s(tok, tmp_path, beam, eos):
    """CTranslate2's n-best come with the scores our decoder gives the same tokens (the
    model's teacher-forced log-probability, length-normalised), whether the outputs end by themselves
    (EOS made likelier) or at their cap; the 1-best stays ``translate_ids``'s; a hypothesis both
    decoders find gets the same number from both, within float32 rounding."""
    model = _model(tok)
    with torch.no_grad():
        model.tgt_embed.weight[EOS_ID] *= eos
    ct = _ct2(model, tok, tmp_path)
    eager = EagerDecoder(model)
    en, _ = _corpus(24, 4)
    srcs = Translator(tok, eager).encode(en)
    opts = DecodeOptions(beam_size=beam, max_len_a=1.0, max_len_b=8)
    theirs, ours = ct.translate_hyps(srcs, opts, n_best=beam), eager.translate_hyps(srcs, opts, n_best=beam)
    assert [h[0].tokens for h in theirs] == ct.translate_ids(srcs, opts)
    assert all(len(h) == beam for h in theirs)
    flat = [(i, h) for i, hyps in enumerate(theirs) for h in hyps]
    forced = eager.score_ids([srcs[i] for i, _ in flat], [h.tokens for _, h in flat])
    for (_, h), lps in zip(flat, forced):
        assert h.logprob == pytest.approx(lps.sum(), abs=1e-4)
        assert h.score == pytest.approx(lps.sum() / ((5 + len(h.tokens) + 1) / 6) ** opts.len_penalty, abs=1e-4)
    matched = 0
    for a, b in zip(theirs, ours):  # a hypothesis both searches found: one number
        eager_scores = {tuple(h.tokens): h.score for h in b}
        for h in a:
            if tuple(h.tokens) in eager_scores:
                assert h.score == pytest.approx(eager_scores[tuple(h.tokens)], abs=1e-4)
                matched += 1
    assert matched >= len(srcs)


@pytest.mark.parametrize("field, value", [("activation", "swiglu"), ("n_kv_heads", 1),
                                          ("positions", "alibi"), ("norm_type", "rmsnorm"), ("arch", "decoder_only")])
def test_unsupported_config_is_refused_naming_the_field(tok, field, value):
    model = _model(tok, **{field: value})
    with pytest.raises(UnsupportedModelError, match=field):
        AiaynConverter(model, tok)


def test_learned_positions_convert_and_decode_like_eager(tok, tmp_path):
    """A learned table goes where the sinusoid table goes: greedy CTranslate2 output = the eager decoder's."""
    model = _model(tok, positions="learned")
    assert isinstance(model.positions.table, torch.nn.Parameter)
    _ct2(model, tok, tmp_path)
    en, _ = _corpus(20, 5)
    srcs = Translator(tok, EagerDecoder(model)).encode(en)
    opts = DecodeOptions(beam_size=1, max_len_a=1.0, max_len_b=5)
    ct2 = CT2Decoder(tmp_path / "ct2", tok, max_side_tokens=model.max_side_tokens)
    assert ct2.translate_ids(srcs, opts, batch_size=4) == EagerDecoder(model).translate_ids(srcs, opts)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_rotary_positions_convert_and_score_like_eager(tok, tmp_path, norm):
    """RoPE (rotated self-attention queries and keys, pairs (2i, 2i+1), no table): CTranslate2's rotary
    self-attention is ours. Forced scores equal the eager model's to float32 rounding (encoder, decoder
    at every step, cross-attention unrotated) and greedy output is the eager decoder's."""
    model = _model(tok, positions="rope", norm=norm)
    assert model.positions is None
    ct = _ct2(model, tok, tmp_path)
    eager = EagerDecoder(model)
    en, de = _corpus(20, 5)
    srcs, tgts = Translator(tok, eager).encode(en), tok.encode(de)
    gap = max(np.abs(a - b).max() for a, b in zip(ct.score_ids(srcs, tgts), eager.score_ids(srcs, tgts)))
    assert gap < 1e-4
    opts = DecodeOptions(beam_size=1, max_len_a=1.0, max_len_b=5)  # beam search differs by design (n-best test)
    assert ct.translate_ids(srcs, opts, batch_size=4) == eager.translate_ids(srcs, opts)


def test_unknown_new_model_field_is_refused(monkeypatch):
    """A future ModelConfig field (e.g. learned positions) with a non-default value is refused by name."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=2, d_ff=64, n_layers=1)
    object.__setattr__(cfg, "dropout", 0.3)  # mapped field: fine
    check_supported(cfg)
    monkeypatch.setattr("aiayn.export.ctranslate2._MAPPED_FIELDS", {"vocab_size", "d_model", "n_heads", "d_ff", "n_layers",
                                                                    "dropout", "norm", "activation", "n_kv_heads"})
    with pytest.raises(UnsupportedModelError, match="max_positions|attention_backend|share_embeddings|attention_dropout"):
        check_supported(cfg.model_copy(update={"max_positions": 2048}))


def test_length_limits_and_explicit_cap(tok, tmp_path, monkeypatch):
    """A source at the input limit and a repetitive source driving the decoder to its cap decode without
    error; the cap is always passed explicitly and each output respects its own sentence's cap."""
    model = _model(tok, max_positions=300)  # cap of the longest source (256 + 50) clamps to 299: the last row
    ct = _ct2(model, tok, tmp_path)
    calls = []
    real = ct.translator.translate_batch

    def spy(*args, **kwargs):
        calls.append(kwargs.get("max_decoding_length"))
        return real(*args, **kwargs)

    monkeypatch.setattr(ct, "translator", type("T", (), {"translate_batch": staticmethod(spy), "device": "cpu"})())
    longest = np.array([tok.encode(["a"])[0][0]] * (256 - 1) + [EOS_ID])  # 256 tokens with EOS
    repetitive = Translator(tok, EagerDecoder(model)).encode([" ".join(["a"] * 30)])[0]
    short = Translator(tok, EagerDecoder(model)).encode(["a dog"])[0]
    srcs = [longest, repetitive, short]
    for beam in (1, 3):
        opts = DecodeOptions(beam_size=beam, max_len_a=1.0, max_len_b=50)
        outs = ct.translate_ids(srcs, opts, batch_size=3)
        caps = max_output_lengths(pad_batch(srcs), max_len_a=1.0, max_len_b=50, max_side_tokens=model.max_side_tokens).tolist()
        assert caps[0] == model.cfg.max_positions - 1  # the table's last row is used
        assert all(len(o) <= c for o, c in zip(outs, caps))
    assert calls and all(isinstance(c, int) and c > 0 for c in calls)
    greedy = DecodeOptions(beam_size=1, max_len_a=1.0, max_len_b=50)
    assert ct.translate_ids(srcs, greedy) == EagerDecoder(model).translate_ids(srcs, greedy)


def test_gate_and_degenerate_checks():
    assert gate(-0.6, 0.5) == REJECTED and gate(-0.4, 0.5) == "accepted" and gate(0.3, 0.5) == "accepted"
    assert max_run([1, 2, 2, 2, 3]) == 3 and max_run([]) == 0
    assert degenerate_lines([[], [5, 5, 5, 5, 5], [5, 5, 5, 5, 5], [1]], [[1], [1, 2], [5] * 6, [1]]) == [0, 1]


# --------------------------------------------------------------------------- the stage end to end


def _project(root: Path, tok_dir: Path, tok: Tokenizer, norm: str = "post") -> Layout:
    return tiny.project(root, tok, norm)


def _params(**quantize):
    return params_from_dict({
        "data": {"test_splits": ["test_a", "test_b"]},
        # greedy: a random model runs every beam into its length cap, where CTranslate2's last step differs
        # from ours (see aiayn.inference.runtimes); greedy parity is exact, so float32 delta is 0
        "evaluate": {"beam_size": 1, "max_len_b": 8},
        "quantize": {"gate_split": "test_a", "calibration_sentences": 16, "score_check_sentences": 8,
                     "attribution_sentences": 12, "throughput_batch1_sentences": 3, "throughput_batch32_sentences": 8,
                     "throughput_threads": [1], **quantize},
    })  # fmt: skip


def test_stage_end_to_end_and_damaged_variant_is_rejected(tok, tmp_path, monkeypatch):
    from aiayn.stages import quantize as stage

    monkeypatch.setenv("AIAYN_TRACKING", "0")
    layout = _project(tmp_path, tmp_path, tok)
    real_build = stage.build_ct2

    def damaged_int8(v, model, tokenizer, out_dir, spm_path):
        if v.name == "ct2-int8":  # a deliberately broken conversion: noisy weights
            model = _model(tok)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.5)
        return real_build(v, model, tokenizer, out_dir, spm_path)

    monkeypatch.setattr(stage, "build_ct2", damaged_int8)
    params = _params(serving_preference=["ct2-int8", "ct2-float32"])
    summary = stage.run(params, layout)
    metrics = json.loads(layout.quantize_metrics.read_text())
    report = json.loads((layout.quantized / "report.json").read_text())

    assert summary["ct2-int8"]["status"] == REJECTED and metrics["ct2-int8"]["rejected"] == 1
    assert json.loads((layout.quantized / "ct2-int8" / "variant.json").read_text())["status"] == REJECTED
    # int16 needs Intel MKL: on other CPUs (AMD EPYC here) it is skipped with the reason, never a crash
    if "int16" in ctranslate2.get_supported_compute_types("cpu"):
        assert summary["ct2-int16"]["status"] == "accepted"
    else:
        assert summary["ct2-int16"]["status"] == "skipped"
        assert "cannot compute int16" in report["variants"]["ct2-int16"]["reason"]
    assert summary["ct2-float32"]["status"] == "accepted" and metrics["ct2-float32"]["test_a"]["bleu_delta"] == 0
    assert summary["serving_default"] == "ct2-float32"  # never the rejected one
    meta = json.loads((layout.quantized / "ct2-int8" / "variant.json").read_text())
    assert meta["library"] == "ctranslate2" and meta["library_version"] == ctranslate2.__version__ and meta["scheme"] == "int8"
    if not torch.cuda.is_available():
        for name in ("ct2-int8_float16", "ct2-bfloat16", "torchao-int8-weight-only", "torchao-int4-weight-only"):
            assert summary[name]["status"] == "skipped" and "CUDA" in report["variants"][name]["reason"]
    # greedy parity is exact (_params' comment; ct2-float32's BLEU delta is 0 above): measured 1.0 on the 24
    # gate lines. The old bound 0.99 admitted no mismatch at 24 lines anyway (23/24 = 0.958); say so
    assert report["score_check"]["passed"] and report["parity"]["greedy_agreement"] == 1.0
    assert metrics["ct2-int8"]["bytes"] < metrics["ct2-float32"]["bytes"]
    for split in ("test_a", "test_b"):
        assert {"bleu", "chrf", "bleu_delta", "chrf_delta"} <= set(metrics["ct2-int8"][split])
    wall = json.loads(layout.quantize_throughput.read_text())
    assert "throughput" not in metrics and "stage_seconds" not in metrics  # wall clock never in a DVC out
    assert set(wall["throughput"]["ct2-int8"]) == {"b1_t1", "b32_t1"}
    b32 = wall["throughput"]["ct2-int8"]["b32_t1"]
    assert b32["rounds"] == stage.THROUGHPUT_ROUNDS and b32["sentences_per_s_min"] <= b32["sentences_per_s"] <= b32["sentences_per_s_max"]
    assert meta["storage"] == "int8_float16"  # int8 matrices, the rest stored in float16
    assert {"encoder.self_attn", "decoder.ffn", "all"} <= set(report["layer_attribution"])
    out = layout.quantized / "outliers"
    assert (out / "outliers.csv").exists() and (out / "outliers.md").exists()
    assert metrics["ct2-int8"]["degenerate_lines"] == 0


def test_int8_variant_is_gated_under_both_ways_of_summing_int8_products(tok, tmp_path, monkeypatch):
    """A ct2-int8 bundle may be served on a VNNI host (exact int32 sums) or an AVX2-only one (int16-
    saturating pairs), so the stage decodes the gate split both ways (the other one in a subprocess set
    to compute it), records both, and rejects the variant when either way fails the gate. This random
    model's activations saturate (2 nats of log-prob, test_int8_weight_round_trip_error_bounded): exact
    sums keep most of its greedy output (test_a's references: BLEU ~88), saturating ones lose most of it
    (~20), on every host; a 20-BLEU gate separates the two."""
    from aiayn.host import host_info
    from aiayn.stages import quantize as stage

    if "avx2" not in host_info(probe=False).isa:
        host_class_skip("needs an x86 CPU with AVX2 (both int8 paths of CTranslate2)")
    monkeypatch.setenv("AIAYN_TRACKING", "0")
    layout = _project(tmp_path, tmp_path, tok)
    quantize = dict(variants=["ct2-float32", "ct2-int8"], serving_preference=["ct2-int8", "ct2-float32"],
                    layer_attribution=False, throughput=False)
    summary = stage.run(_params(**quantize, max_bleu_drop=20.0), layout)
    sums = json.loads((layout.quantized / "ct2-int8" / "variant.json").read_text())["int8_sums"]
    assert sums["this_host"]["accumulation"] in ACCUMULATIONS and set(sums["gated"]) == set(ACCUMULATIONS)
    exact, saturating = sums["gated"]["exact"], sums["gated"]["int16-saturating"]
    if exact["status"] == "skipped":  # an Intel CPU without VNNI, or MKL/oneDNN held back by the environment
        held = [v for v in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "CT2_USE_MKL")
                if os.environ.get(v)]
        if held:  # an environment skip (a failure under AIAYN_TEST_STRICT=1): unset them to run it
            pytest.skip(f"{held} set: CTranslate2's int8 kernels held back here: {exact}")
        host_class_skip(f"this CPU cannot sum int8 products exactly (an Intel CPU without VNNI): {exact}")
    assert exact["status"] == "accepted" and exact["bleu_delta"] > -20
    assert saturating["status"] == REJECTED and saturating["bleu_delta"] < exact["bleu_delta"] - 20
    assert summary["ct2-int8"]["status"] == REJECTED and summary["serving_default"] == "ct2-float32"

    # a gate wide enough for both ways accepts the variant, and it ships
    summary = stage.run(_params(**quantize, max_bleu_drop=100.0), layout)
    sums = json.loads((layout.quantized / "ct2-int8" / "variant.json").read_text())["int8_sums"]
    assert all(g["status"] == "accepted" for g in sums["gated"].values())
    assert summary["ct2-int8"]["status"] == "accepted" and summary["serving_default"] == "ct2-int8"
