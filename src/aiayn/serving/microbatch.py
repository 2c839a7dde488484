"""Dynamic micro-batching for ``aiayn serve``: concurrent requests share decoder batches.

The first waiting request opens a batch, which closes at ``max_batch`` units or after ``max_wait_s``
(at once when no other request is queued or decoding: a lone client pays no batching delay);
batches from different requests decode together (grouped by model and decoding job) in ``workers``
threads. If a merged batch fails, each request of it is decoded alone, so a failure stays with its
request. A request whose caller gave up (its future cancelled: the client hung up) is dropped from
the queue and from any batch not yet started; a batch already decoding finishes, and its result for
that request is discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MicroBatcher"]


def _translate_ids(model: Any, units: list[np.ndarray], options: Hashable) -> list:
    return model.translator.decoder.translate_ids(units, options)


@dataclass
class _Item:
    model: Any
    job: Hashable
    units: list[np.ndarray]
    future: asyncio.Future


class MicroBatcher:
    """Dynamic micro-batching across concurrent requests (see the module doc).

    ``submit(model, units, job)`` -> ``decode(model, units, job)``'s result per unit, where requests
    with the same ``model`` (by identity) and ``job`` (hashable: the decoding options) share batches.
    ``decode`` defaults to ``model.translator.decoder.translate_ids(units, job)`` (output ids per
    unit; ``job`` a ``DecodeOptions``). ``observe(n)`` is called with each decoded batch's unit count
    (the batch-size histogram). Raises ``ValueError`` for a bad setting.
    """

    def __init__(self, *, max_batch: int, max_wait_s: float, workers: int,
                 observe: Callable[[int], None] = lambda n: None,
                 decode: Callable[[Any, list[np.ndarray], Hashable], list] = _translate_ids) -> None:
        if max_batch < 1 or max_wait_s < 0 or workers < 1:
            raise ValueError(f"max_batch >= 1, max_wait_s >= 0, workers >= 1 expected, got {max_batch}, {max_wait_s}, {workers}")
        self.max_batch, self.max_wait_s, self.workers = max_batch, max_wait_s, workers
        self.observe, self.decode = observe, decode
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="aiayn-decode")
        self._slots = asyncio.Semaphore(workers)
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self._outstanding = 0  # submitted requests not yet answered (queued or decoding)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Decode what is queued, wait for batches in flight, then stop."""
        while not self._queue.empty() or self._inflight:
            await asyncio.sleep(0.01)
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, model: Any, units: list[np.ndarray], job: Hashable) -> list:
        """Queue ``units`` for decoding; their results, in order. Cancelling the caller drops them
        (module doc); a decoding error is raised here, for this request only."""
        if not units:
            return []
        fut = asyncio.get_running_loop().create_future()
        self._outstanding += 1
        try:
            await self._queue.put(_Item(model, job, units, fut))
            return await fut
        finally:
            self._outstanding -= 1

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()  # a worker is free: open the next batch
            item = await self._queue.get()
            while item.future.done():  # its caller gave up while it waited
                item = await self._queue.get()
            batch, n = [item], len(item.units)
            deadline = loop.time() + self.max_wait_s
            while n < self.max_batch:
                if self._queue.empty():
                    if self._outstanding <= len(batch):
                        break  # no other request anywhere (queued or decoding): waiting only adds latency
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(self._queue.get(), left)
                    except TimeoutError:
                        break
                else:
                    nxt = self._queue.get_nowait()
                if nxt.future.done():
                    continue
                batch.append(nxt)
                n += len(nxt.units)
            task = loop.create_task(self._decode(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _decode(self, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        try:
            groups: dict[tuple[int, Hashable], list[_Item]] = {}
            for it in batch:
                groups.setdefault((id(it.model), it.job), []).append(it)
            for items in groups.values():
                items = [it for it in items if not it.future.done()]  # callers that gave up meanwhile
                if not items:
                    continue
                units = [u for it in items for u in it.units]
                self.observe(len(units))
                try:
                    ids = await loop.run_in_executor(self._executor, self.decode, items[0].model, units, items[0].job)
                except Exception:  # noqa: BLE001 - isolate: each request of the failed batch alone
                    for it in items:
                        if it.future.done():
                            continue
                        try:
                            one = await loop.run_in_executor(self._executor, self.decode, it.model, it.units, it.job)
                        except Exception as e:  # noqa: BLE001
                            if not it.future.done():
                                it.future.set_exception(e)
                        else:
                            if not it.future.done():
                                it.future.set_result(one)
                    continue
                k = 0
                for it in items:
                    if not it.future.done():
                        it.future.set_result(ids[k : k + len(it.units)])
                    k += len(it.units)
        finally:
            self._slots.release()
