"""CTranslate2's int8 arithmetic in PyTorch, and which int8 arithmetic this host's CTranslate2 runs.

CTranslate2 4.8 ``compute_type="int8"`` on CPU computes every linear layer (the fused QKV, output and
FFN projections, and the output projection over the tied embedding) as

    y = (x_q @ w_q^T) / (s_x * s_w) + b,   x_q = rint(x * s_x), s_x = 127 / max|x_row| (per token)
                                           w_q = rint(w * s_w), s_w = 127 / max|w_row| (per output row)

with the int8 products accumulated in int32, and looks embeddings up in the dequantized int8 rows.
How the int32 sums are formed depends on the CPU and on the GEMM library CTranslate2 picks:

- ``exact``: VNNI (``vpdpbusd``: u8 x s8 products summed straight into int32), or Intel MKL's
  generic path. ``int8_logprobs(..., accumulation="exact")`` reproduces CTranslate2 to float32
  rounding (measured: max |difference| < 1e-5 nats on the test models).
- ``int16-saturating``: oneDNN on an x86 CPU without VNNI (AVX2 or AVX-512 without VNNI, e.g. AMD
  Zen 2/3). oneDNN shifts activations to u8 (``x_q + 128``, compensated exactly afterwards) and
  ``vpmaddubsw`` adds each PAIR of consecutive u8 x s8 products into a SATURATING int16
  (255 * 127 * 2 = 64,770 > 32,767), so a pair of large same-sign weights under large activations
  is clipped. ``accumulation="int16-saturating"`` reproduces that, also to float32 rounding.

CTranslate2 uses MKL on Intel CPUs (and wherever ``CT2_USE_MKL=1``), oneDNN on other x86 CPUs;
``ONEDNN_MAX_CPU_ISA`` caps oneDNN's instruction set (``AVX2`` makes any x86 CPU with AVX2 compute
like an AVX2-only host: how the tests reach the saturating path on a VNNI host).
MKL on an Intel CPU follows ``MKL_CBWR`` / ``MKL_ENABLE_INSTRUCTIONS``: held to AVX2 it runs its AVX2
kernel, ``vpmaddubsw`` again, so it saturates like oneDNN's (measured on an AVX-512 VNNI Xeon: ``MKL_CBWR=AVX2``,
``AVX2,STRICT`` and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` reproduce ``int16-saturating`` to 1e-6, ``MKL_CBWR=AVX512``
and unset reproduce ``exact``; ``COMPATIBLE`` neither). That AVX2 kernel is what an Intel CPU without VNNI or
AVX-512 runs. ``int8_accumulation()`` names this host's case; ``unknown`` where it has not been measured
(Intel AVX-512 CPUs without VNNI, other MKL branches).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.config.schema import BOS_ID, EOS_ID
from aiayn.host import host_info
from aiayn.model import Transformer
from aiayn.quantize.fake_quant import fake_quantize_int8

__all__ = ["ACCUMULATIONS", "ACCUMULATION_ENV", "int8_accumulation", "int8_linear", "with_int8_arithmetic",
           "int8_logprobs", "decode_under"]

ACCUMULATIONS = ("exact", "int16-saturating")
#: Environment that makes CTranslate2 (loaded after it is set) sum int8 products each way on an x86 CPU
#: with AVX2: MKL's path, free to pick its kernels, is exact (VNNI, or its generic kernel on non-Intel CPUs);
#: oneDNN capped at AVX2 uses ``vpmaddubsw``, which saturates pairs in int16 whatever the CPU can do.
ACCUMULATION_ENV = {"exact": {"CT2_USE_MKL": "1", "MKL_CBWR": "AUTO"},
                    "int16-saturating": {"CT2_USE_MKL": "0", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
_VNNI = ("avx512_vnni", "avx_vnni")
#: ``ONEDNN_MAX_CPU_ISA`` values that leave oneDNN its VNNI kernels (oneDNN's ISA names, upper case).
_ONEDNN_VNNI_ISAS = ("AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16",
                     "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX",
                     "AVX10_1_512_AMX_FP16", "DEFAULT", "ALL")


def int8_accumulation() -> dict[str, str]:
    """How this host's CTranslate2 sums int8 products: ``{"backend": "mkl" | "onednn" | "other",
    "accumulation": "exact" | "int16-saturating" | "unknown", "why": one line}`` (see the module doc)."""
    info = host_info(probe=False)
    vnni = any(f in info.isa for f in _VNNI)
    if os.uname().machine not in ("x86_64", "AMD64"):
        return {"backend": "other", "accumulation": "unknown", "why": f"{os.uname().machine}: not measured"}
    use_mkl = os.environ.get("CT2_USE_MKL")
    mkl = info.vendor == "GenuineIntel" if use_mkl is None else use_mkl.strip().lower() in ("1", "true", "yes", "on")
    if mkl:
        return _mkl_accumulation(info.vendor == "GenuineIntel", vnni, "avx512f" in info.isa)
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if vnni and (not cap or cap in _ONEDNN_VNNI_ISAS):
        return {"backend": "onednn", "accumulation": "exact", "why": "oneDNN with VNNI"}
    why = f"oneDNN capped at {cap}" if vnni else "oneDNN without VNNI (vpmaddubsw)"
    return {"backend": "onednn", "accumulation": "int16-saturating", "why": why}


def _mkl_accumulation(intel: bool, vnni: bool, avx512: bool) -> dict[str, str]:
    """``int8_accumulation()`` where CTranslate2 uses MKL: on Intel CPUs by the kernels MKL is allowed
    (``MKL_CBWR``'s branch, ``MKL_ENABLE_INSTRUCTIONS``), as measured (module doc)."""
    if not intel:
        return {"backend": "mkl", "accumulation": "exact", "why": "MKL's generic path on a non-Intel CPU"}
    branch = os.environ.get("MKL_CBWR", "").split(",")[0].strip().upper()
    allowed = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "").strip().upper()
    held = "MKL_CBWR" if branch == "AVX2" else "MKL_ENABLE_INSTRUCTIONS" if allowed == "AVX2" else None
    if held or not (vnni or avx512):
        why = f"MKL held to AVX2 ({held})" if held else "MKL on an Intel CPU without AVX-512 or VNNI"
        return {"backend": "mkl", "accumulation": "int16-saturating", "why": f"{why}: vpmaddubsw"}
    if vnni and branch in ("", "AUTO", "AVX512") and not allowed:
        return {"backend": "mkl", "accumulation": "exact", "why": "MKL with VNNI"}
    why = (f"MKL_CBWR={branch}" if branch not in ("", "AUTO") else
           f"MKL_ENABLE_INSTRUCTIONS={allowed}" if allowed else "MKL on an Intel CPU without VNNI")
    return {"backend": "mkl", "accumulation": "unknown", "why": f"{why}: not measured"}


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of ``x`` ``(..., K)`` in float64: ``(x_q, scale)``, ``scale`` ``(..., 1)``
    (an all-zero row gets scale 1)."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax == 0, torch.ones_like(amax), 127.0 / amax)
    return torch.round(x * scale).clamp(-127, 127), scale


def int8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                accumulation: str = "exact") -> torch.Tensor:
    """CTranslate2's int8 ``x @ weight.T + bias`` (module doc): ``x`` ``(..., K)``, ``weight`` ``(N, K)``
    -> ``(..., N)`` float32. Integer sums are exact in float64 (|sum| <= 255 * 127 * K < 2**53).
    Raises ``ValueError`` for an unknown ``accumulation``."""
    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
    w_q, s_w = _quantize_rows(weight.detach().double())  # (N, K), (N, 1)
    x_q, s_x = _quantize_rows(x.double())  # (..., K), (..., 1)
    if accumulation == "exact":
        acc = x_q @ w_q.T  # (..., N)
    else:
        lead, k = x_q.shape[:-1], x_q.shape[-1]
        u = x_q.reshape(-1, k) + 128  # (M, K) u8
        pairs = u[:, None, :] * w_q[None, :, :]  # (M, N, K)
        if k % 2:
            pairs = torch.cat([pairs, pairs.new_zeros(*pairs.shape[:2], 1)], dim=-1)
        pairs = pairs.reshape(*pairs.shape[:2], -1, 2).sum(-1).clamp(-32768, 32767)  # (M, N, ceil(K/2)) int16
        acc = (pairs.sum(-1) - 128 * w_q.sum(-1)).reshape(*lead, -1)  # the u8 shift compensated exactly
    y = (acc / (s_x * s_w.T)).float()
    return y + bias if bias is not None else y


class _Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear, accumulation: str) -> None:
        super().__init__()
        self.linear, self.accumulation = linear, accumulation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.linear.weight, self.linear.bias, accumulation=self.accumulation)


def with_int8_arithmetic(model: Transformer, accumulation: str) -> Transformer:
    """A deep copy of ``model`` (eval mode) whose linear layers compute ``int8_linear`` and whose
    embeddings hold their int8 round trip. The output projection over the tied embedding is NOT
    replaced (the model calls ``F.linear`` on it): ``int8_logprobs`` applies it."""
    copy_ = copy.deepcopy(model).eval()
    for module in list(copy_.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, _Int8Linear(child, accumulation))
    with torch.no_grad():
        for emb in {id(e): e for e in (copy_.src_embed, copy_.tgt_embed)}.values():
            emb.weight.copy_(fake_quantize_int8(emb.weight))
    return copy_


@torch.inference_mode()
def int8_logprobs(model: Transformer, sources: list[np.ndarray], targets: list[list[int]], *,
                  accumulation: str = "exact") -> list[np.ndarray]:
    """Teacher-forced log-probabilities under CTranslate2's int8 arithmetic (``aiayn.inference.runtimes.EagerDecoder.score_ids``'s
    contract: ``(len + 1,)`` float64 per sentence, the final EOS included)."""
    q = with_int8_arithmetic(model, accumulation)
    hidden: list[torch.Tensor] = []
    hook = q.decoder_norm.register_forward_hook(lambda _m, _i, out: hidden.append(out))
    proj = model.tgt_embed.weight  # the tied output projection, quantized per row like every linear
    out = []
    try:
        for src, tgt in zip(sources, targets):
            hidden.clear()
            q(torch.as_tensor(np.asarray(src, dtype=np.int64))[None], torch.tensor([[BOS_ID, *tgt]]))
            logits = int8_linear(hidden[-1], proj, accumulation=accumulation)  # (1, T + 1, V)
            lp = torch.log_softmax(logits[0].double(), dim=-1)
            out.append(lp[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS_ID])].numpy())
    finally:
        hook.remove()
    return out


def decode_under(accumulation: str, ct2_dir: str | Path, sources: list[np.ndarray], options: Any, *,
                 max_side_tokens: int, compute_type: str, inter_threads: int = 1) -> tuple[list[list[int]] | None, dict]:
    """Decode ``sources`` (``(len,)`` int64 ids with EOS) with the CTranslate2 model in ``ct2_dir``
    (which holds its ``spm.model``) in a subprocess whose CTranslate2 sums int8 products the
    ``accumulation`` way (``ACCUMULATION_ENV``), under ``options`` (``aiayn.inference.runtimes.DecodeOptions``).

    Returns ``(output ids, the subprocess's int8_accumulation())``; ids are None when that process
    could not compute that way (e.g. no AVX2, or MKL on an Intel CPU without VNNI): the second item
    says what it had instead. Raises ``RuntimeError`` when the subprocess fails.
    """
    import dataclasses
    import json
    import subprocess
    import sys
    import tempfile

    if accumulation not in ACCUMULATIONS:
        raise ValueError(f"accumulation must be one of {ACCUMULATIONS}, got {accumulation!r}")
    job = {"ct2_dir": str(ct2_dir), "accumulation": accumulation, "options": dataclasses.asdict(options),
           "max_side_tokens": max_side_tokens, "compute_type": compute_type, "inter_threads": inter_threads,
           "sources": [np.asarray(x).tolist() for x in sources]}
    with tempfile.TemporaryDirectory(prefix="aiayn-int8-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        env = {**os.environ, **ACCUMULATION_ENV[accumulation]}
        proc = subprocess.run([sys.executable, "-m", "aiayn.quantize.int8", str(job_path), str(out_path)],
                              env=env, capture_output=True, text=True)
        if proc.returncode or not out_path.is_file():
            raise RuntimeError(f"int8 decoding under {accumulation} sums failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-2000:]}")
        out = json.loads(out_path.read_text(encoding="utf-8"))
    return out["ids"], out["host"]


def _decode_job(job_path: str, out_path: str) -> None:
    """The subprocess side of ``decode_under``: decode the job when this process sums the asked way."""
    import json

    from aiayn.inference.runtimes import CT2Decoder, DecodeOptions
    from aiayn.tokenizer import Tokenizer

    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    host, ids = int8_accumulation(), None
    if host["accumulation"] == job["accumulation"]:
        decoder = CT2Decoder(job["ct2_dir"], Tokenizer.load(Path(job["ct2_dir"]) / "spm.model"),
                             max_side_tokens=job["max_side_tokens"], compute_type=job["compute_type"],
                             inter_threads=job["inter_threads"])
        ids = decoder.translate_ids([np.asarray(x, dtype=np.int64) for x in job["sources"]],
                                    DecodeOptions(**job["options"]))
    Path(out_path).write_text(json.dumps({"host": host, "ids": ids}), encoding="utf-8")


if __name__ == "__main__":
    import sys

    _decode_job(*sys.argv[1:3])
