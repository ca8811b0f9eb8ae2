"""The engine core's heap, frozen once warm: `--engine-option freeze_engine_heap=true|false`.

vLLM freezes its engine core's heap (`gc.freeze()`) at the end of the core's own start-up, before
this server's warm-up batch. Whatever the warm-up then builds in that process stays scanned by
every full collection of Python's cycle collector for the life of the server: the vision
encoder's compilation (`--compile-mm-encoder`: TorchDynamo's graphs, guards and Inductor's
kernels), the first requests' caches. A full collection holds the interpreter, and the engine
core's interpreter is the thread that launches the GPU's kernels, so a pause there is a pause of
the GPU while a batch starts.

This is the server's own freeze (media/memory_release.freeze_startup_heap) done in vLLM's worker
process, called once after the warm-up through `collective_rpc` (a mixin of the worker extension,
engines/vllm/worker.py). With one GPU the worker runs inside the engine core, so the core's heap is
the one frozen. Reference counting still frees frozen objects; only the cycle collector skips them.
"""

from __future__ import annotations

import gc
import time

from reward_server.media.memory_release import freeze_startup_heap

OPTION = "freeze_engine_heap"
METHOD = "reward_freeze_heap"


def freeze_process_heap() -> dict[str, float | int]:
    """Collect, then freeze what is alive: the objects a full collection scanned before (`scanned`),
    how many are frozen in all now, and what collecting and freezing took."""
    scanned = len(gc.get_objects())
    start = time.perf_counter()
    frozen = freeze_startup_heap()
    return {"scanned": scanned, "frozen": frozen, "took_ms": round((time.perf_counter() - start) * 1000, 1)}


class HeapFreeze:
    """vLLM's worker extension: the method the engine calls once after the warm-up."""

    def reward_freeze_heap(self) -> dict[str, float | int]:
        return freeze_process_heap()
