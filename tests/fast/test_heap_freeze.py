"""The start-up heap frozen once warm: the reclaimer's collection runs on the event loop, and with an
engine's heap (some 700k objects) a full scan stalled every body and input for 0.4 s per batch
(issue 40). A server process freezes what is alive once warm; cycles made by requests afterwards
are still freed, and /stats shows the pauses and the frozen count. An embedded service (tests,
notebooks) leaves the collector of its host process alone."""

from __future__ import annotations

import asyncio
import gc

import httpx

from reward_server.media.memory_release import Reclaimer, freeze_startup_heap
from reward_tools.launch import ServerProcess
from tests.helpers.memory import collector_off, eventually, frames_in_a_cycle, freed
from tests.helpers.servers import InProcessServer


def test_objects_alive_at_the_freeze_are_never_scanned_and_later_cycles_are_still_freed():
    alive_at_start = [{"n": i} for i in range(50_000)]
    try:
        frozen = freeze_startup_heap()
        assert frozen >= len(alive_at_start)
        # what a request allocates afterwards (an episode's frames kept by a traceback's cycle) is
        # not frozen: the reclaimer's collection still frees it, and says what it cost
        reclaimer = Reclaimer(threshold_bytes=1, delay_s=0)

        async def scenario() -> None:
            ref = frames_in_a_cycle(1 << 20)
            reclaimer.released(1 << 20)
            assert await freed(ref), "a cycle made after the freeze was never freed"
            # the run is counted once it has also trimmed the allocator
            assert await eventually(lambda: reclaimer.runs == 1, timeout_s=5.0)

        with collector_off():  # only the reclaimer's collection may free it
            asyncio.run(scenario())
        stats = reclaimer.as_dict()
        assert stats["reclaim_runs"] == 1
        assert stats["reclaim_pause_ms"] > 0 and stats["reclaim_pause_ms"] == stats["reclaim_last_pause_ms"]
    finally:
        gc.unfreeze()  # the test process's heap is not ours to keep frozen


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", timeout=10).json()


def test_a_server_process_freezes_its_heap_once_warm_and_the_flag_or_embedding_turns_it_off(tmp_path):
    frozen_counts = {}
    for flag in ("--freeze-heap", "--no-freeze-heap"):
        with ServerProcess(["--engine", "fake", "--decode-workers", "1", flag], log_path=tmp_path / f"{flag}.log") as s:
            s.wait_ready(120)
            frozen_counts[flag] = _stats(s.url)["heap_frozen_objects"]
    assert frozen_counts["--freeze-heap"] > 10_000  # the server's imported libraries at least
    assert frozen_counts["--no-freeze-heap"] == 0
    before = gc.get_freeze_count()
    with InProcessServer() as server:  # embedded: the host's collector is left alone
        body = _stats(server.url)
        assert body["heap_frozen_objects"] == 0 and gc.get_freeze_count() == before
        assert {"reclaim_runs", "reclaim_pause_ms", "reclaim_last_pause_ms"} <= set(body)
