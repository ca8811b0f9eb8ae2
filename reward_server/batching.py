"""Dynamic batching in front of an engine, with a bounded queue.

Requests that arrive within `batch_wait_ms` of each other (up to `max_batch_size`) go to the
engine as one `run_batch` call. Up to `engine.max_concurrent_batches` batches run at once, so
an engine with its own scheduler (vLLM) keeps taking work while earlier batches decode.
A full queue refuses new work at once (the server answers 503 + Retry-After) instead of
letting callers wait without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reward_server.engine_io import EngineOutput, EngineRequest
from reward_server.engines.base import Engine, EngineDead

logger = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """More work is waiting than the server admits; retry later."""


@dataclass
class _Item:
    request: EngineRequest
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    def __init__(
        self,
        engine: Engine,
        max_batch_size: int,
        batch_wait_ms: float,
        max_queue: int,
        on_batch: Callable[[int], None] | None = None,
        on_engine_dead: Callable[[str], None] | None = None,
    ):
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.max_queue = max_queue
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._slots = asyncio.Semaphore(engine.max_concurrent_batches)
        self._running: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self._on_batch = on_batch
        self._on_engine_dead = on_engine_dead
        self.in_flight = 0  # requests handed to the engine and not yet answered

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="batcher")

    async def submit(self, request: EngineRequest) -> tuple[EngineOutput, float]:
        """Run one request; returns the output and the milliseconds it waited in the queue."""
        if self._queue.qsize() >= self.max_queue:
            raise QueueFull(f"{self._queue.qsize()} requests are already waiting (limit {self.max_queue})")
        item = _Item(request, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(item)
        return await item.future

    async def _collect(self) -> list[_Item]:
        first = await self._queue.get()
        batch = [first]
        deadline = time.perf_counter() + self.batch_wait_s
        while len(batch) < self.max_batch_size:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _loop(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._collect()
            except asyncio.CancelledError:
                self._slots.release()
                raise
            task = asyncio.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[_Item]) -> None:
        started = time.perf_counter()
        live = [item for item in batch if not item.future.done()]  # a caller may have gone
        self.in_flight += len(live)
        try:
            if self._on_batch:
                self._on_batch(len(live))
            outputs = await self.engine.run_batch([item.request for item in live])
            for item, out in zip(live, outputs, strict=True):
                if item.future.done():
                    continue
                if isinstance(out, Exception):
                    item.future.set_exception(out)
                else:
                    item.future.set_result((out, (started - item.enqueued) * 1000))
        except Exception as exc:
            if isinstance(exc, EngineDead) and self._on_engine_dead:
                self._on_engine_dead(str(exc))
            for item in live:
                if not item.future.done():
                    item.future.set_exception(exc)
        finally:
            self.in_flight -= len(live)
            self._slots.release()

    async def stop(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
        for task in list(self._running):
            task.cancel()
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if not item.future.done():
                item.future.set_exception(EngineDead("the server is shutting down"))
