"""The quantized variants: what each is, whether this machine can build it, and how to build it.

A variant's name says its library and scheme (``ct2-int8``, ``torchao-int4-weight-only``); its
folder ``artifacts/quantized/<name>/`` holds the model, ``spm.model`` and ``variant.json``
(name, library and version, scheme, compute type, device, status). CTranslate2 variants are
self-contained CTranslate2 model directories; torchao variants are a PyTorch state dict that
needs CUDA (torchao is imported only when CUDA is present).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from aiayn.model import Transformer
from aiayn.export.ctranslate2 import AiaynConverter
from aiayn.faults import fault_point
from aiayn.tokenizer import Tokenizer

__all__ = ["Variant", "VARIANTS", "unavailable_reason", "build_ct2", "build_torchao", "library_version", "dir_bytes"]


@dataclass(frozen=True)
class Variant:
    name: str
    library: str  # "ctranslate2" | "torchao"
    scheme: str  # CTranslate2 quantization / torchao config
    device: str  # "cpu" | "cuda"
    compute_type: str | None = None  # CTranslate2 compute type
    #: CTranslate2 ``quantization`` at conversion (how the file stores weights), when it differs from
    #: ``scheme``: ct2-int8 stores its int8 matrices with every other tensor (position table, biases,
    #: LayerNorm) in float16, and CTranslate2 widens those to float32 at load on CPU (compute type
    #: int8 = int8_float32), so only the file is smaller; the BLEU gate measures the rounding.
    storage: str | None = None

    def metadata(self) -> dict:
        return asdict(self) | {"library_version": library_version(self.library)}


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("ct2-float32", "ctranslate2", "float32", "cpu", "float32"),
    Variant("ct2-int8", "ctranslate2", "int8", "cpu", "int8", storage="int8_float16"),
    Variant("ct2-int16", "ctranslate2", "int16", "cpu", "int16"),
    Variant("ct2-int8_float16", "ctranslate2", "int8_float16", "cuda", "int8_float16"),
    Variant("ct2-bfloat16", "ctranslate2", "bfloat16", "cuda", "bfloat16"),
    Variant("torchao-int8-weight-only", "torchao", "int8-weight-only", "cuda"),
    Variant("torchao-int4-weight-only", "torchao", "int4-weight-only", "cuda"),
)}  # fmt: skip


def library_version(library: str) -> str | None:
    try:
        return version(library)
    except PackageNotFoundError:
        return None


def unavailable_reason(v: Variant) -> str | None:
    """Why ``v`` cannot be built on this machine (None: it can)."""
    if v.device == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device (GPU-only variant)"
        if v.library == "ctranslate2":
            import ctranslate2

            if ctranslate2.get_cuda_device_count() == 0:
                return "CTranslate2 sees no CUDA device"
    if library_version(v.library) is None:
        return f"{v.library} is not installed"
    if v.library == "ctranslate2":
        import ctranslate2

        supported = ctranslate2.get_supported_compute_types(v.device)
        if v.compute_type not in supported:  # e.g. int16 needs Intel MKL: refused on an AMD CPU
            return (f"CTranslate2 cannot compute {v.compute_type} on this {v.device} "
                    f"(supported here: {', '.join(sorted(supported))})")
    return None


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def build_ct2(v: Variant, model: Transformer, tokenizer: Tokenizer, out_dir: Path, spm_path: Path) -> Path:
    """Convert ``model`` with ``v.storage`` (else ``v.scheme``) weights into ``out_dir`` (replaced);
    copies ``spm.model``."""
    AiaynConverter(model, tokenizer).convert(str(out_dir), quantization=v.storage or v.scheme, force=True)
    fault_point("quantize.ct2_converted")
    shutil.copyfile(spm_path, out_dir / "spm.model")
    return out_dir


def build_torchao(v: Variant, model: Transformer, out_dir: Path, spm_path: Path) -> Transformer:
    """A CUDA copy of ``model`` with torchao weight-only quantization (bfloat16 activations for int4);
    its state dict is saved to ``out_dir/model.pt``. Needs CUDA (torchao imported here only)."""
    import copy

    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    q = Transformer(model.cfg, device="cuda")
    q.load_state_dict(copy.deepcopy(model.state_dict()))
    q.eval()
    if v.scheme == "int4-weight-only":
        q = q.to(torch.bfloat16)
        quantize_(q, Int4WeightOnlyConfig(group_size=32))
    else:
        quantize_(q, Int8WeightOnlyConfig())
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(q.state_dict(), out_dir / "model.pt")
    shutil.copyfile(spm_path, out_dir / "spm.model")
    return q
