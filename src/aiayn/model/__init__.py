"""The Transformer model: attention backends, positions, KV cache, encoder-decoder."""

from aiayn.model.attention import BACKENDS, select_backend
from aiayn.model.kv_cache import KVCache
from aiayn.model.positions import SinusoidalPositions, sinusoid_table
from aiayn.model.transformer import Transformer

__all__ = ["BACKENDS", "KVCache", "SinusoidalPositions", "Transformer", "select_backend", "sinusoid_table"]
