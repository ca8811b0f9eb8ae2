"""Giving memory back after large episodes are answered.

Two things keep a process's memory after its last reference to an episode's frames is gone:
- reference cycles: an exception keeps its traceback, whose frames keep their locals (frames,
  processed tensors) until the cycle collector runs, and in a server that allocates few Python
  objects between bursts it may not run for minutes;
- the allocator: glibc keeps freed heap memory in its arenas (one per thread that allocated)
  instead of returning it, unless asked (`malloc_trim`).

An episode task that fails keeps its traceback (on the exception and on the task), whose frames
keep the episode's frames and the task's own deadline, which refers back to the task: a cycle,
freed only by the collector. `Reclaimer.released(n)` is told
how many decoded bytes were given back; once enough has been given back since the last time
(64 MB), it collects cycles and then trims the allocator, at most once per `min_interval_s`, a
little later (`delay_s`: what the answer still held is gone by then).

The collection runs on the event loop and holds the interpreter: with the engine's start-up heap
(vLLM, torch, transformers: some 700k objects) a full collection took 0.4 s, long enough to stall
every body being read and every input being processed; on an H200 it was 0.4 s of each 2.2 s
batch of 64 episodes. `freeze_startup_heap()` (after the engine started and warmed up) marks that
heap permanent, as `vllm serve` does: collections, ours and Python's own, then scan only what
requests allocated (0.0 ms after the freeze in the same process). `pause_ms` says what they cost.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[], int] | None:
    """glibc's malloc_trim(0), or None where there is none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = libc.malloc_trim if libc is not None else None  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)  # ctypes releases the GIL while it runs


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, then mark every object alive now as permanent (never
    scanned or freed by the cycle collector again; reference counting still frees them). Returns
    how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class Reclaimer:
    def __init__(self, threshold_bytes: int = 64 << 20, min_interval_s: float = 2.0, delay_s: float = 0.5):
        self.threshold_bytes = threshold_bytes
        self.min_interval_s = min_interval_s
        self.delay_s = delay_s
        self.pending = 0  # bytes released since the last reclaim
        self.runs = 0
        self.pause_ms = 0.0  # the event loop's time in gc.collect(), all runs together
        self.last_pause_ms = 0.0
        self._trim = _malloc_trim()
        self._last = 0.0
        self._scheduled = False

    def released(self, nbytes: int) -> None:
        self.pending += nbytes
        self._schedule()

    def _schedule(self) -> None:
        if self.pending < self.threshold_bytes or self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        wait = max(self.delay_s, self._last + self.min_interval_s - time.monotonic())
        self._scheduled = True
        loop.call_later(wait, lambda: loop.create_task(self._reclaim()))

    async def _reclaim(self) -> None:
        started = time.perf_counter()
        self.pending = 0
        try:
            found = gc.collect()
            self.last_pause_ms = (time.perf_counter() - started) * 1000
            self.pause_ms += self.last_pause_ms
            if self._trim is not None:
                await asyncio.to_thread(self._trim)
        finally:
            self._scheduled = False
            self._last = time.monotonic()
            self._schedule()  # what was given back while this ran
        self.runs += 1
        logger.debug(
            "reclaimed: %d objects in cycles, collected in %.1f ms, %.0f ms in all",
            found,
            self.last_pause_ms,
            (time.perf_counter() - started) * 1000,
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "reclaim_runs": self.runs,
            "reclaim_pause_ms": round(self.pause_ms, 3),
            "reclaim_last_pause_ms": round(self.last_pause_ms, 3),
        }
