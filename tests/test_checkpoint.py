"""Checkpoint state that only a many-GPU host exercises, checked on CPU."""

from __future__ import annotations

from aiayn.checkpoint import cuda_rng_states


def test_cuda_rng_states_come_back_in_device_order_past_ten_devices():
    """With 11+ GPUs a string sort gives cuda0, cuda1, cuda10, cuda2, ...: device 2 would get device 10's
    generator on resume. The keys are ordered by their number."""
    state = {"torch": "cpu", "numpy": [], "python": []} | {f"cuda{i}": f"gen{i}" for i in range(12)}
    assert cuda_rng_states(state) == [f"gen{i}" for i in range(12)]
    assert cuda_rng_states({"torch": "cpu"}) == []
