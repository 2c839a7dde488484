"""Attention kernels: the Triton FlashAttention-2 kernel and its PyTorch reference.

``flash_attention`` (``flash_attention.py``) is the fused GPU kernel, forward and
backward; ``attention_reference`` (``reference.py``) computes the same thing the
plain way and is what the kernel is tested against. Whether Triton runs
compiled (CUDA) or interpreted (``TRITON_INTERPRET=1``, CPU) is fixed when this
package is first imported.
"""

from aiayn.kernels.flash_attention import (
    INTERPRETED,
    MAX_HEAD_DIM,
    SUPPORTED_DTYPES,
    flash_attention,
    flash_attention_forward,
)
from aiayn.kernels.attention_reference import attention_mask, attention_reference

__all__ = [
    "flash_attention",
    "flash_attention_forward",
    "attention_reference",
    "attention_mask",
    "MAX_HEAD_DIM",
    "SUPPORTED_DTYPES",
    "INTERPRETED",
]
