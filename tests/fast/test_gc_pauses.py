"""The engine core's heap frozen once warm and the collector's pauses timed in vLLM's worker
(engines/vllm/heap.py, engines/vllm/step_timing.py), on this process's real collector."""

from __future__ import annotations

import gc

from reward_server.engines.vllm.heap import freeze_process_heap
from reward_server.engines.vllm.step_timing import GcPauses


def test_every_pause_is_summed_and_each_full_collection_gets_a_row():
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        gc.collect(0)
        assert pauses.full == 0 and pauses.rows == [] and pauses.total_ms > 0
        young = pauses.total_ms
        cycle: list = []
        cycle.append(cycle)
        del cycle
        gc.collect()  # a full one, which frees the cycle
    finally:
        gc.callbacks.remove(pauses)
    assert pauses.full == 1 and pauses.total_ms > young
    (row,) = pauses.drain()
    assert row["what"] == "gc" and row["t1"] >= row["t0"] and row["collected"] >= 1
    assert pauses.drain() == []  # a row is written once


def test_the_workers_heap_freeze_says_what_it_scanned_and_froze():
    alive = [{"n": i} for i in range(20_000)]
    try:
        answer = freeze_process_heap()
        assert answer["scanned"] >= len(alive) and answer["frozen"] >= len(alive)
        assert answer["took_ms"] >= 0
        assert len(gc.get_objects()) < len(alive)  # what a full collection scans from now on
    finally:
        gc.unfreeze()  # the test process's heap is not ours to keep frozen
