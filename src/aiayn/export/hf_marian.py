"""Export to the Hugging Face Marian format: ``transformers.MarianMTModel`` + ``MarianTokenizer``.

``export_marian(model_dir, out_dir)`` writes a folder that ``transformers`` loads offline
(``MarianMTModel.from_pretrained(out_dir)``, ``pipeline("translation", model=out_dir)``), that
CTranslate2's stock ``ct2-transformers-converter`` reads, and that MLflow's ``transformers`` flavor
logs::

    config.json                 MarianConfig (architecture, special ids)
    model.safetensors           the weights under HF's names (tied embedding stored once)
    generation_config.json      our decoding defaults (beam, length penalty, length cap, forbidden ids)
    source.spm, target.spm      our joint sentencepiece model (the same file twice: Marian's layout)
    vocab.json                  piece -> id, id = our id (MarianTokenizer looks pieces up here)
    tokenizer_config.json, special_tokens_map.json
    aiayn.json                  where it came from (model.json) and how it was mapped
    README.md                   a model card for a model hub

Paper model -> Marian, exactly (checked by ``tests/test_hf_marian.py`` to float32 rounding):

- Layers: ``MarianEncoderLayer`` / ``MarianDecoderLayer`` are post-norm, ``LN(x + drop(f(x)))``
  (``self_attn_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm``), ours too
  (``_Residual`` with ``norm='post'``); LayerNorm eps 1e-5 on both sides (torch's default).
- Attention: separate q/k/v/out projections with biases, scores scaled by ``head_dim ** -0.5`` on
  both sides; names map one to one. FFN ``fc1``/``fc2`` = our ``w1``/``w2``; ``activation_function``
  ``relu`` (paper) or ``gelu`` (exact erf in both: ``torch.nn.functional.gelu``).
- Embeddings: ``scale_embedding=True`` (x sqrt(d_model), paper Sec. 3.4); ``share_embeddings``
  -> ``share_encoder_decoder_embeddings`` (one matrix for encoder, decoder and ``lm_head``;
  without it the decoder's matrix is still tied to ``lm_head``, ``tie_word_embeddings=True``, as
  ours). ``final_logits_bias`` = 0: our output projection has no bias.
- Sinusoids: Marian concatenates ``[sin | cos]`` along the features
  (``MarianSinusoidalPositionalEmbedding``: column ``i`` = sin, ``d/2 + i`` = cos, both at
  frequency ``10000 ** (-2i / d)``) while ours interleaves them (column ``2i`` sin, ``2i + 1``
  cos). Marian never saves its table (``_keys_to_ignore_on_save``) and recomputes it at load,
  so ours cannot be shipped: instead the whole residual stream is permuted,
  ``h' = h[..., perm]`` with ``perm = [0, 2, 4, ..., 1, 3, 5, ...]`` (``sinusoid_permutation``).
  Every ``d_model``-wide axis is permuted (embedding columns, q/k/v/fc1 input columns, out/fc2
  output rows and biases, LayerNorm gain and bias); LayerNorm statistics and the tied output
  ``h' . E'^T = h . E^T`` do not change, so the permuted model computes the same function and
  Marian's own table becomes exactly ours.
- Special ids: ours are fixed (``aiayn.config.schema``: PAD 0, UNK 1, BOS 2, EOS 3). Marian's defaults
  (pad = last id, eos = 0, decoding starts from pad) are replaced by ours: ``pad_token_id=0``,
  ``eos_token_id=3``, ``decoder_start_token_id=2`` (our decoder's first input is BOS, whose
  embedding is trained, not Marian's zero pad row), ``forced_eos_token_id=3``.

Decoding (``generation_config.json``; ``aiayn.inference.search`` is the reference):
``suppress_tokens=[PAD, UNK, BOS]`` and ``min_new_tokens=1`` (never generated / EOS not first),
``num_beams=beam_size``, ``early_stopping=True`` (a sentence ends with ``beam_size`` finished
hypotheses, as in fairseq). Three rules have no Marian equivalent (beam outputs can differ; measured
in ``docs/results.md#hugging-face-marian-export-parity``): (1) the length penalty: HF divides by
``|Y| ** length_penalty``, GNMT (ours, the paper) by ``((5 + |Y|) / 6) ** alpha``; ``length_penalty``
carries our alpha; (2) the per-sentence cap ``max_len_a * src_len + max_len_b``: HF has one
``max_length`` per call, set to the cap of the longest accepted source (``aiayn_max_len_a`` and
``aiayn_max_len_b`` are recorded beside it; ``marian_translate_ids`` applies the per-sentence rule);
(3) at the cap HF forces EOS with score 0 (``ForcedEOSTokenLogitsProcessor``) where we count EOS's
log-probability, so a beam hypothesis that never ends is favoured by HF. Greedy search is unaffected by
all three.

Refused (``MarianExportError`` naming the ``ModelConfig`` field): ``norm='pre'`` (Marian's layers
are post-norm only and have no final stack LayerNorm), ``norm_type='rmsnorm'``, ``positions``
other than ``sinusoidal`` (learned tables are not saved by Marian; rotary and ALiBi do not exist in
``MarianAttention``), ``activation='swiglu'`` (no gated FFN), ``n_kv_heads < n_heads`` (Marian's
k/v projections are ``d_model x d_model``), ``arch='decoder_only'``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.config.schema import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ModelConfig
from aiayn.io import atomic_dir, atomic_write_json, atomic_write_text
from aiayn.model.positions import sinusoid_table
from aiayn.tokenizer import Tokenizer
from aiayn.inference.runtimes import DecodeOptions
from aiayn.inference.translator import Translator, max_source_tokens

__all__ = [
    "MarianExportError", "HF_MARIAN_DIR", "check_marian_supported", "sinusoid_permutation", "marian_config",
    "marian_state_dict", "generation_config", "marian_model", "export_marian", "marian_translate_ids", "marian_logprobs",
]  # fmt: skip

#: Where the export stage writes the folder, inside the serving bundle (``export.formats``).
HF_MARIAN_DIR = "hf-marian"


class MarianExportError(ValueError):
    """The model cannot be expressed as a ``MarianMTModel``; the message names the ``ModelConfig`` field."""


def check_marian_supported(cfg: ModelConfig) -> None:
    """Raise ``MarianExportError`` naming the first ``ModelConfig`` field Marian cannot express."""
    refusals = [
        (cfg.arch != "encoder_decoder", "arch", "MarianMTModel is an encoder-decoder; the decoder-only stream "
         "(source prefix, left padding, per-row positions) has no Marian form"),
        (cfg.norm != "post", "norm", "Marian's layers are post-norm only (LayerNorm after each residual add; "
         "MarianConfig has no normalize_before and no final encoder/decoder LayerNorm)"),
        (cfg.norm_type != "layernorm", "norm_type", "Marian's layers use nn.LayerNorm (mean and bias), not RMSNorm"),
        (cfg.positions == "learned", "positions", "Marian recomputes its sinusoid table at load time and never "
         "saves it (MarianMTModel._keys_to_ignore_on_save): a learned table cannot be carried"),
        (cfg.positions in ("rope", "alibi"), "positions", "MarianAttention has no rotary queries/keys and no "
         "score bias; Marian adds a sinusoid table to the embeddings"),
        (cfg.activation not in ("relu", "gelu"), "activation", "Marian's FFN is fc2(act(fc1(x))) with biases; "
         "a gated (SwiGLU) FFN has no Marian form"),
        (cfg.kv_heads != cfg.n_heads, "n_kv_heads", "MarianAttention's k/v projections are d_model x d_model "
         "(every head has its own keys and values): grouped-query attention has no Marian form"),
    ]
    for refused, field, why in refusals:
        if refused:
            raise MarianExportError(f"ModelConfig.{field}={getattr(cfg, field)!r} cannot be exported to the "
                                    f"Hugging Face Marian format: {why}")


def sinusoid_permutation(d_model: int) -> torch.Tensor:
    """``perm`` ``(d_model,)`` long with ``marian_table[:, k] == our_table[:, perm[k]]``: our even
    (sin) columns first, then our odd (cos) columns (module docstring)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


#: Our parameter name (after the layer prefix) -> (Marian's, how the residual-stream permutation
#: applies: "in" = input columns, "out" = output rows / the vector itself, None = untouched).
_ATTN = {f"{p}_proj.weight": "in" for p in "qkv"} | {f"{p}_proj.bias": None for p in "qkv"} | {
    "out_proj.weight": "out", "out_proj.bias": "out"}
_FFN = {"ffn.w1.weight": ("fc1.weight", "in"), "ffn.w1.bias": ("fc1.bias", None),
        "ffn.w2.weight": ("fc2.weight", "out"), "ffn.w2.bias": ("fc2.bias", "out")}
_ENCODER_LAYER = {f"self_attn.{k}": (f"self_attn.{k}", v) for k, v in _ATTN.items()} | _FFN | {
    f"attn_block.norm.{p}": (f"self_attn_layer_norm.{p}", "out") for p in ("weight", "bias")} | {
    f"ffn_block.norm.{p}": (f"final_layer_norm.{p}", "out") for p in ("weight", "bias")}
_DECODER_LAYER = {f"self_attn.{k}": (f"self_attn.{k}", v) for k, v in _ATTN.items()} | {
    f"cross_attn.{k}": (f"encoder_attn.{k}", v) for k, v in _ATTN.items()} | _FFN | {
    f"self_block.norm.{p}": (f"self_attn_layer_norm.{p}", "out") for p in ("weight", "bias")} | {
    f"cross_block.norm.{p}": (f"encoder_attn_layer_norm.{p}", "out") for p in ("weight", "bias")} | {
    f"ffn_block.norm.{p}": (f"final_layer_norm.{p}", "out") for p in ("weight", "bias")}


def _permuted(t: torch.Tensor, how: str | None, perm: torch.Tensor) -> torch.Tensor:
    t = t.detach().to(torch.float32).cpu()
    if how == "in":  # (out_features, d_model): reads the residual stream
        t = t[:, perm]
    elif how == "out":  # (d_model, ...) or (d_model,): writes the residual stream / per-feature vector
        t = t[perm]
    return t.contiguous()


def marian_state_dict(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our ``Transformer`` state dict -> ``MarianMTModel``'s (float32, CPU, residual stream permuted).

    Every key of ``MarianMTModel.state_dict()`` except the two ``embed_positions.weight`` tables
    (Marian builds those itself): tied matrices appear under each of their names. Raises
    ``MarianExportError`` for an unsupported config and ``KeyError`` naming a missing weight.
    """
    check_marian_supported(cfg)
    perm = sinusoid_permutation(cfg.d_model)
    out: dict[str, torch.Tensor] = {}
    for i in range(cfg.n_layers):
        for ours, (theirs, how) in _ENCODER_LAYER.items():
            out[f"model.encoder.layers.{i}.{theirs}"] = _permuted(state[f"encoder_layers.{i}.{ours}"], how, perm)
        for ours, (theirs, how) in _DECODER_LAYER.items():
            out[f"model.decoder.layers.{i}.{theirs}"] = _permuted(state[f"decoder_layers.{i}.{ours}"], how, perm)
    tgt = _permuted(state["tgt_embed.weight"], "in", perm)  # (V, d_model): columns are features
    src = tgt if cfg.share_embeddings else _permuted(state["src_embed.weight"], "in", perm)
    if cfg.share_embeddings:
        out["model.shared.weight"] = tgt
    out["model.encoder.embed_tokens.weight"] = src
    out["model.decoder.embed_tokens.weight"] = tgt
    out["lm_head.weight"] = tgt  # tied output projection (paper Sec. 3.4)
    out["final_logits_bias"] = torch.zeros(1, cfg.vocab_size)  # ours has no output bias
    return out


def marian_config(cfg: ModelConfig) -> dict[str, Any]:
    """``MarianConfig`` keyword arguments for ``cfg`` (module docstring: why each value).
    Raises ``MarianExportError`` for an unsupported config."""
    check_marian_supported(cfg)
    return dict(
        architectures=["MarianMTModel"], vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size,
        d_model=cfg.d_model, encoder_layers=cfg.n_layers, decoder_layers=cfg.n_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation,
        max_position_embeddings=cfg.max_positions, scale_embedding=True, static_position_embeddings=True,
        share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=True,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=0.0,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None, is_encoder_decoder=True, use_cache=True,  # decoding rules: generation_config
    )  # fmt: skip


def generation_config(cfg: ModelConfig, decode: DecodeOptions) -> dict[str, Any]:
    """``GenerationConfig`` keyword arguments carrying ``decode`` (module docstring: what maps and
    what cannot). ``max_length`` counts the decoder's start token and EOS: ``max_len + 2`` for the
    cap ``max_len`` of the longest source the model accepts (``aiayn.inference.translator.max_source_tokens``)."""
    longest = max_source_tokens(cfg.max_side_tokens, decode)
    max_len = min(int(decode.max_len_a * longest + decode.max_len_b), cfg.max_side_tokens - 1)
    beam = dict(length_penalty=decode.len_penalty, early_stopping=True) if decode.beam_size > 1 else {}
    return dict(  # HF refuses beam-only flags with num_beams=1 (GenerationConfig.validate)
        decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID, suppress_tokens=[PAD_ID, UNK_ID, BOS_ID], min_new_tokens=1,
        num_beams=decode.beam_size, do_sample=False, max_length=max_len + 2,
        aiayn_max_len_a=decode.max_len_a, aiayn_max_len_b=decode.max_len_b, **beam,
    )  # fmt: skip


def _tokenizer_files(tokenizer: Tokenizer, spm_path: Path, out: Path, *, src_lang: str, tgt_lang: str,
                     model_max_length: int) -> None:
    """Write Marian's tokenizer files: ``vocab.json`` (our ids), the spm model twice, and the
    tokenizer config through ``MarianTokenizer.save_pretrained``."""
    from transformers import MarianTokenizer

    vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    if len(vocab) != tokenizer.vocab_size:
        raise MarianExportError(f"{spm_path}: sentencepiece pieces are not unique; vocab.json cannot map ids 1:1")
    atomic_write_json(out / "vocab.json", vocab)
    for name in ("source.spm", "target.spm"):  # one joint model; Marian's layout has one per side
        shutil.copyfile(spm_path, out / name)
    hf_tok = MarianTokenizer(
        source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"), vocab=str(out / "vocab.json"),
        source_lang=src_lang, target_lang=tgt_lang, unk_token=tokenizer.id_to_piece(UNK_ID),
        eos_token=tokenizer.id_to_piece(EOS_ID), pad_token=tokenizer.id_to_piece(PAD_ID),
        bos_token=tokenizer.id_to_piece(BOS_ID),  # special, so skip_special_tokens drops the decoder's start
        model_max_length=model_max_length, clean_up_tokenization_spaces=False,  # our decode keeps spaces as is
        additional_special_tokens=[],
    )  # fmt: skip
    hf_tok.save_pretrained(str(out))


def _card(meta: dict[str, Any], *, src_lang: str, tgt_lang: str, decode: DecodeOptions) -> str:
    return "\n".join([
        "---", f"language: [{src_lang}, {tgt_lang}]", "library_name: transformers", "pipeline_tag: translation",
        "tags: [translation, marian, aiayn]", "---", "",
        f"# aiayn {src_lang}->{tgt_lang} (Transformer, Vaswani et al. 2017) in the Marian format", "",
        f"Trained by the aiayn pipeline (preset {meta.get('model_preset')}, seed {meta.get('seed')}, "
        f"weights of steps {meta.get('averaged_steps')}); exported by `aiayn export-hf`. `aiayn.json` says how.", "",
        "```python", "from transformers import pipeline",
        f"translate = pipeline(\"translation_{src_lang}_to_{tgt_lang}\", model=\"PATH\")",
        "translate([\"A man is riding a bicycle.\"])", "```", "",
        f"Decoding defaults: beam {decode.beam_size}. aiayn's beam search divides by the GNMT length penalty "
        f"((5+|Y|)/6)**{decode.len_penalty}; transformers divides by |Y|**{decode.len_penalty}, so beam outputs "
        "can differ from aiayn's (greedy outputs agree).", "",
    ])  # fmt: skip


def marian_model(model: Any) -> Any:
    """A ``transformers.MarianMTModel`` (eval mode, float32, CPU) computing what our ``Transformer``
    ``model`` computes (module docstring). Raises ``MarianExportError`` for a config Marian cannot
    express, or when Marian's own sinusoid table is not ours permuted (a changed ``transformers``)."""
    from transformers import MarianConfig, MarianMTModel

    cfg = model.cfg
    hf = MarianMTModel(MarianConfig(**marian_config(cfg))).eval()
    missing, unexpected = hf.load_state_dict(marian_state_dict(model.state_dict(), cfg), strict=False)
    tables = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    if set(missing) != tables or unexpected:
        raise MarianExportError(f"MarianMTModel weights do not line up: missing {missing}, unexpected {unexpected}")
    ours = sinusoid_table(cfg.max_positions, cfg.d_model)[:, sinusoid_permutation(cfg.d_model)]
    for table in (hf.model.encoder.embed_positions.weight, hf.model.decoder.embed_positions.weight):
        if not torch.allclose(table.detach(), ours, atol=1e-5, rtol=0):  # float64 maths, rounded once on both sides
            raise MarianExportError("transformers' Marian sinusoid table is not aiayn's with [sin | cos] features: "
                                    "this transformers version changed MarianSinusoidalPositionalEmbedding")
    return hf


def export_marian(model_dir: str | Path, out_dir: str | Path, *, decode: DecodeOptions = DecodeOptions(),
                  src_lang: str = "en", tgt_lang: str = "de") -> Path:
    """Write the Hugging Face Marian folder of the model bundle in ``model_dir`` to ``out_dir``
    (atomically replaced; files listed in the module docstring). Returns ``out_dir``.

    Raises ``FileNotFoundError`` for an incomplete bundle, ``MarianExportError`` as ``marian_model``,
    ``aiayn.checkpoint.CheckpointError`` for unreadable weights.
    """
    from transformers import GenerationConfig

    model_dir = Path(model_dir)
    translator = Translator.from_dir(model_dir, device="cpu")
    cfg = translator.decoder.model.cfg
    check_marian_supported(cfg)  # before any work
    hf = marian_model(translator.decoder.model)
    meta = json.loads((model_dir / "model.json").read_text(encoding="utf-8"))
    with atomic_dir(Path(out_dir)) as out:
        hf.save_pretrained(str(out), safe_serialization=True)
        GenerationConfig(**generation_config(cfg, decode)).save_pretrained(str(out))
        _tokenizer_files(translator.tokenizer, model_dir / "spm.model", out, src_lang=src_lang, tgt_lang=tgt_lang,
                         model_max_length=translator.max_source_tokens(decode))
        atomic_write_json(out / "aiayn.json", {
            "format": "hf-marian", "model": meta, "decode": decode.__dict__,
            "mapping": {"residual_permutation": "[0, 2, 4, ..., 1, 3, 5, ...] (aiayn.export.hf_marian.sinusoid_permutation)",
                        "ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
                        "length_penalty": "transformers: |Y|**length_penalty; aiayn: ((5+|Y|)/6)**len_penalty"}})
        atomic_write_text(out / "README.md", _card(meta, src_lang=src_lang, tgt_lang=tgt_lang, decode=decode))
    return Path(out_dir)


def marian_translate_ids(hf_model: Any, sources: list[np.ndarray], decode: DecodeOptions, *,
                         batch_size: int = 64) -> list[list[int]]:
    """Decode our source id arrays (EOS included) with ``hf_model.generate`` under OUR length rule:
    sources of one length form the batches, so ``max_new_tokens = int(a * len + b) + 1`` (EOS
    included) is exact per sentence. ``decode.len_penalty`` is passed as HF's ``length_penalty``
    (a different formula, module docstring). Returns token lists without BOS/EOS, in input order."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[list[int]] = [[] for _ in sources]
    cap = hf_model.config.max_position_embeddings - 1
    # keyword arguments override the folder's generation_config (a passed GenerationConfig whose values
    # equal HF's defaults is overwritten by the model's); under greedy search HF's own defaults for the
    # beam-only flags, which it would warn about otherwise
    beam = dict(num_beams=decode.beam_size, length_penalty=decode.len_penalty if decode.beam_size > 1 else 1.0,
                early_stopping=decode.beam_size > 1, do_sample=False)
    start = 0
    while start < len(order):
        n = len(sources[order[start]])
        end = start
        while end < len(order) and len(sources[order[end]]) == n and end - start < batch_size:
            end += 1
        idx = order[start:end]
        ids = torch.as_tensor(np.stack([sources[i] for i in idx]), dtype=torch.long)  # (B, n): no padding
        max_len = min(int(decode.max_len_a * n + decode.max_len_b), cap)
        with torch.inference_mode():
            gen = hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_len + 1,
                                    **beam)
        for i, row in zip(idx, gen[:, 1:].tolist()):  # drop the decoder's start token
            out[i] = row[: row.index(EOS_ID)] if EOS_ID in row else [t for t in row if t != PAD_ID]
        start = end
    return out


def marian_logprobs(hf_model: Any, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
    """Teacher-forced log-probabilities ``(B, T, V)`` float32 of ``hf_model`` for our right-padded
    batch ``src`` ``(B, S)`` and ``tgt_in`` ``(B, T)`` (BOS first): what ``Transformer.forward``
    followed by ``log_softmax`` gives for the same ids."""
    with torch.inference_mode():
        logits = hf_model(input_ids=src, attention_mask=src.ne(PAD_ID).long(), decoder_input_ids=tgt_in).logits
    return torch.log_softmax(logits.float(), dim=-1)
