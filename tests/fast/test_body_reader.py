"""The body reader (reward_server/http/body.py) as the raw batch path uses it: each waiter wakes
once its own bytes are there and sees exactly the bytes sent, a broken body wakes every waiter
with its error, and a large body's memory follows arrival while a helper thread faults in the
pages just ahead of it (prefault.py). Fast tier: real asyncio, real mappings, no server."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import weakref

import numpy as np
import pytest

from reward_server.http import prefault
from reward_server.http.body import BodyLimits, BodyReader
from reward_server.request_errors import ClientGone
from tests.helpers.memory import collector_off

LIMITS = BodyLimits(max_bytes=1 << 30, idle_timeout_s=5, min_rate=1, total_s=30)
KIB = 1024


def _chunks(data: bytes, size: int, kind=bytes) -> list[dict]:
    out = []
    for start in range(0, len(data), size):
        piece = kind(data[start : start + size])
        out.append({"type": "http.request", "body": piece, "more_body": start + size < len(data)})
    return out


@pytest.mark.parametrize("kind", [bytes, bytearray], ids=["bytes", "bytearray"])
def test_each_waiter_wakes_when_its_own_bytes_arrived_and_reads_them_exactly(kind):
    """64 episodes' regions of a 4 MiB body sent in 64 KiB chunks (bytes, as uvicorn sends them, or
    bytearrays, which take the other copy path): no waiter returns before its last byte arrived,
    each returns after the chunk that completes it, and every region holds what was sent."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 4 * 1024 * KIB, dtype=np.uint8).tobytes()
    ends = [(k + 1) * len(data) // 64 - (k % 3) for k in range(64)]

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        reader = BodyReader(queue.get, len(data), LIMITS).start()
        woke: dict[int, int] = {}

        async def waiter(k: int) -> bytes:
            view = await reader.wait_for(ends[k])
            woke[k] = reader.received
            return bytes(view[ends[k] - 1000 : ends[k]])

        tasks = [asyncio.create_task(waiter(k)) for k in range(64)]
        for message in _chunks(data, 64 * KIB, kind):
            before = reader.received
            queue.put_nowait(message)
            for _ in range(4):
                await asyncio.sleep(0)
            for k, task in enumerate(tasks):
                if ends[k] > reader.received:
                    assert not task.done(), f"waiter {k} for {ends[k]} bytes woke at {reader.received}"
                elif ends[k] > before:  # completed by this chunk: awake now
                    assert task.done(), f"waiter {k} still asleep with {reader.received} of {ends[k]} bytes"
        results = await asyncio.gather(*tasks)
        whole = bytes(await reader.read_all())
        await reader.close()
        return results, woke, whole

    results, woke, whole = asyncio.run(scenario())
    assert whole == data
    for k in range(64):
        assert results[k] == data[ends[k] - 1000 : ends[k]]
        assert woke[k] >= ends[k]


def test_a_body_that_breaks_wakes_every_waiter_with_the_error():
    """The client leaves after 1 MiB of a 4 MiB body: waiters for bytes that will never come all
    get ClientGone at once; the one whose bytes had arrived got them."""

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        reader = BodyReader(queue.get, 4 * 1024 * KIB, LIMITS).start()
        early = asyncio.create_task(reader.wait_for(512 * KIB))
        late = [asyncio.create_task(reader.wait_for(n * 1024 * KIB)) for n in (2, 3, 4)]
        whole = asyncio.create_task(reader.read_all())
        queue.put_nowait({"type": "http.request", "body": b"a" * (1024 * KIB), "more_body": True})
        queue.put_nowait({"type": "http.disconnect"})
        got = await asyncio.wait_for(early, 5)
        errors = await asyncio.wait_for(asyncio.gather(*late, whole, return_exceptions=True), 5)
        await reader.close()
        return bytes(got), errors

    got, errors = asyncio.run(scenario())
    assert got == b"a" * (512 * KIB)
    assert all(isinstance(e, ClientGone) for e in errors), errors


def _resident_bytes(address: int) -> int | None:
    """Rss of the mapping that starts at `address`, from /proc/self/smaps (None if not found)."""
    with open("/proc/self/smaps") as fh:
        inside = False
        for line in fh:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == address
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    return None


def _eventually(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads the mapping's resident size from /proc")
def test_a_large_bodys_pages_are_faulted_in_just_ahead_of_arrival_and_never_further():
    """A 64 MiB body: after one byte the mapping holds a page or two; after 3 MiB the helper has
    faulted in pages beyond them (where the kernel can: Linux 5.14+), never more than twice what
    arrived; the bytes written land intact."""
    declared = 64 * 1024 * KIB
    sent = bytearray()

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        reader = BodyReader(queue.get, declared, LIMITS).start()
        address = reader._address
        assert address is not None, "a body this large is read into a mapping"
        queue.put_nowait({"type": "http.request", "body": b"x", "more_body": True})
        sent.extend(b"x")
        await reader.wait_for(1)
        one_byte = _resident_bytes(address)
        chunk = bytes(range(256)) * (4 * KIB)  # 1 MiB
        for _ in range(3):
            queue.put_nowait({"type": "http.request", "body": chunk, "more_body": True})
            sent.extend(chunk)
            await reader.wait_for(len(sent))
        ahead = await asyncio.to_thread(
            _eventually, lambda: prefault._works is False or _resident_bytes(address) > len(sent) + 2 * 1024 * KIB
        )
        three_mib = _resident_bytes(address)
        content = bytes((await reader.wait_for(len(sent)))[: len(sent)])
        reader._task.cancel()
        return one_byte, ahead, three_mib, content

    one_byte, ahead, three_mib, content = asyncio.run(scenario())
    assert content == bytes(sent)
    assert one_byte is not None and one_byte <= 2 * 4096, one_byte
    assert three_mib <= 2 * len(sent) + 2 * 4096, (three_mib, len(sent))
    if prefault._works:
        assert ahead and three_mib > len(sent) + 2 * 1024 * KIB, (three_mib, len(sent))


@pytest.mark.parametrize("ending", ["answered", "client_left"])
def test_a_closed_body_is_unmapped_at_once_without_the_cycle_collector(ending):
    """Once its request is answered (or its client left mid-body), a body's mapping goes back to the
    kernel when the reader closes, with Python's collector off: the reader's task ends by raising,
    and that exception's traceback once held the reader, so every 192 MiB batch body stayed mapped
    until a collection, which then unmapped it on the event loop."""
    size = 8 * 1024 * KIB

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        reader = BodyReader(queue.get, size, LIMITS).start()
        buffer = reader.buffer
        if ending == "answered":
            for message in _chunks(b"x" * size, 1024 * KIB):
                queue.put_nowait(message)
            async with asyncio.timeout(5):  # not wait_for: on 3.11 its task keeps what it raised in a cycle
                assert bytes((await reader.read_all())[-3:]) == b"xxx"
        else:
            queue.put_nowait({"type": "http.request", "body": b"x" * (1024 * KIB), "more_body": True})
            queue.put_nowait({"type": "http.disconnect"})
            try:  # not pytest.raises: its record of the error would hold the reader
                async with asyncio.timeout(5):
                    await reader.read_all()
                raise AssertionError("a body whose client left was read whole")
            except ClientGone:
                pass
        await reader.close()
        ref = weakref.ref(reader)
        del reader
        assert ref() is None, f"the closed reader is kept by {[type(r).__name__ for r in gc.get_referrers(ref())]}"
        return buffer

    with collector_off():
        buffer = asyncio.run(scenario())
        assert _eventually(lambda: buffer.closed), "the body's mapping was not given back"


def test_a_body_still_viewed_stays_mapped_until_its_last_view_goes():
    """An episode cancelled mid-way may still hold its frames (views into the body) when the reader
    closes: the mapping stays and its bytes stay readable (unmapped under the view, reading it would
    crash the server)."""
    size = 1024 * KIB

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        reader = BodyReader(queue.get, size, LIMITS).start()
        for message in _chunks(bytes(range(256)) * (size // 256), 64 * KIB):
            queue.put_nowait(message)
        view = np.frombuffer(await asyncio.wait_for(reader.read_all(), 5), np.uint8)
        await reader.close()
        return view

    view = asyncio.run(scenario())
    time.sleep(0.2)  # the helper thread's unmapping, refused while viewed
    assert view[:4].tolist() == [0, 1, 2, 3] and int(view[-1]) == 255
