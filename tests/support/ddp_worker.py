"""One rank of the distributed-training tests (tests/test_distributed.py), launched by torchrun.

``python -m torch.distributed.run --standalone --nproc_per_node N ... -m support.ddp_worker
OUT CKPT MAX_STEPS GRAD_ACCUM [HOLD_AT]`` (``aiayn.train.distributed.torchrun_command``; ``tests`` on ``PYTHONPATH``)

Trains test_train's synthetic task with ``train(..., world=world_from_env())``; rank 0 writes
``OUT/weights.safetensors`` and ``OUT/steps.json`` ({step: [loss, tokens, grad_norm]}) and
appends each finished step to ``OUT/progress`` (the tests watch it to kill the job mid-run).
With HOLD_AT = k > 0, rank 0 waits after step k until SIGTERM/SIGINT arrives, so a signal sent
then stops the job at step k on a host of any speed (``hold_until_signalled``);
``AIAYN_TEST_DISTRIBUTED`` picks ``train.distributed`` (default ddp). The weights written are
the final checkpoint's (full tensors also under FSDP).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from aiayn.checkpoint import list_checkpoints, load_checkpoint
from aiayn.train.distributed import init_process_group, world_from_env
from aiayn.train import train
from test_train import MODEL, cfg, synthetic_split

#: The worker's ``train.distributed`` (``ddp``, the default, or ``fsdp``): set by tests/test_distributed.py.
#: The tests' own variable, not a setting of the product (``aiayn.config.settings``).
DISTRIBUTED_ENV = "AIAYN_TEST_DISTRIBUTED"


HOLD_TIMEOUT_S = 300.0


def hold_until_signalled(announce: Callable[[], None], timeout_s: float = HOLD_TIMEOUT_S) -> None:
    """Put a latch in front of the SIGTERM/SIGINT handlers in place (the trainer's, which still get the
    signal and stop the loop after this step), then ``announce()`` (the test sends its signal once it sees
    that), then wait for the signal, at most ``timeout_s`` seconds. Called inside the loop, so the other
    rank waits in the next collective: the job cannot run past this step before the signal, however slow
    or starved the process that sends it, and a signal right after the announcement is not missed."""
    got = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame) -> None:
        got.set()
        if callable(previous[signum]):
            previous[signum](signum, frame)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        announce()
        deadline = time.monotonic() + timeout_s
        while not got.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main() -> int:
    out, ckpt, max_steps, grad_accum = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    hold_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    out.mkdir(parents=True, exist_ok=True)
    world = world_from_env()
    init_process_group(world, torch.device("cpu"))
    steps: dict[int, list[float]] = {}

    def done(step: int) -> None:
        with (out / "progress").open("a") as f:
            f.write(f"{step}\n")

    def on_step(step: int, m: dict[str, float]) -> None:
        steps[step] = [m["loss"], m["tokens"], m["grad_norm"]]
        if step == hold_at:
            hold_until_signalled(lambda: done(step))
        else:
            done(step)

    mode = os.environ.get(DISTRIBUTED_ENV, "ddp")
    result = train(MODEL, cfg(max_steps=max_steps, grad_accum=grad_accum, checkpoint_every=5, keep_checkpoints=20,
                              distributed=mode),
                   synthetic_split(96), None, ckpt, on_step=on_step, world=world)
    if world.is_main:
        final = load_checkpoint(list_checkpoints(ckpt)[-1])
        assert final.step == result.step
        save_file({k: v.clone().contiguous() for k, v in final.model.items()}, str(out / "weights.safetensors"))
        (out / "steps.json").write_text(json.dumps({"steps": steps, "stopped_by": result.stopped_by,
                                                    "resumed_from": result.resumed_from, "step": result.step}))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
