"""A raw batch's body goes back to the kernel when its answer is sent, not at the next run of the
cycle collector: the hook's 192 MiB batch stayed mapped until a collection, which unmapped it on
the event loop (26 ms a collection on an H200 host, 3.7 ms without it).
Fast tier: the real app in this process on the fake engine, the real client, Python's collector off."""

from __future__ import annotations

import mmap
import weakref

import pytest

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.score import ScoreOptions
from reward_server.http import body
from tests.helpers.episodes import episode_frames
from tests.helpers.memory import collector_off
from tests.helpers.servers import InProcessServer, wait_until


@pytest.fixture
def mapped_bodies(monkeypatch) -> list[weakref.ref]:
    """Every mapped body buffer the server makes, seen through weak references (the buffer is unchanged)."""
    made: list[weakref.ref] = []
    make = body._buffer

    def seen(length: int | None):
        buffer = make(length)
        if isinstance(buffer, mmap.mmap):
            made.append(weakref.ref(buffer))
        return buffer

    monkeypatch.setattr(body, "_buffer", seen)
    return made


def test_a_raw_batchs_body_is_unmapped_once_answered_without_a_collection(mapped_bodies):
    episodes = [(ScoreOptions(task_text="t", nframes=16), episode_frames(24, 64, seed=i)) for i in range(8)]
    with InProcessServer(reclaim_memory=False) as server, collector_off():
        client = RewardClient(server.url, RetryPolicy(deadline_s=60))
        for _ in range(3):
            items = client.score_episodes(episodes)
            assert all(i.response is not None for i in items)
        assert len(mapped_bodies) >= 3, "the batches did not arrive as mapped bodies"
        mapped = [b for b in (ref() for ref in mapped_bodies) if b is not None]  # None: freed already
        assert wait_until(lambda: all(b.closed for b in mapped), timeout=5), (
            f"{sum(not b.closed for b in mapped)} of {len(mapped)} answered bodies are still mapped"
        )
