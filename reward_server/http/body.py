"""Reading a request body from ASGI, progressively, and noticing when the client leaves.

The body lands in one buffer reserved from Content-Length, so episodes can be prepared from
views of it while the rest is still arriving (`wait_for`), with no join or copy. Memory and
admission follow the bytes that arrived, never the bytes declared: a large body's buffer is an
anonymous mapping whose pages exist only once written or faulted in just ahead of the arriving
bytes by a helper thread (prefault.py: never more than what arrived; a client that declares
512 MiB and sends one byte holds a page or two), and each chunk is admitted against
`--max-inflight-mb` as it arrives (`Admission.take_arrived`). A body that would push the bytes in
progress past the limit is refused then (503, retryable) and gives back what it held, so partial
uploads never wait on each other.

A body has a total deadline a trickle cannot extend: after a grace of `--body-timeout-s` it must
have arrived at `--body-min-rate-kib-s` on average, and all of it within `--request-timeout-s`;
a sender that stalls for `--body-timeout-s` is cut off too (408, connection closed). A client
deadline (X-Reward-Deadline-S) shorter than `--request-timeout-s` that passes while the body
arrives is the client's deadline, not a refusal: 504 deadline_exceeded, retryable. After the
body, the reader keeps listening so the handler can be cancelled (and its engine work aborted)
when the client disconnects.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import mmap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from reward_server.http.prefault import Prefault, unmap_soon
from reward_server.request_errors import BodyDeadline, BodyTimeout, BodyTooLarge, ClientGone

Receive = Callable[[], Awaitable[dict[str, Any]]]


# bodies declared larger than this get a lazily backed mapping; smaller ones a plain bytearray
# (zero-filled at once, which touches its pages: harmless at this size)
MAPPED_FROM_BYTES = 256 * 1024


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int  # --max-body-mb
    idle_timeout_s: float  # --body-timeout-s: no byte for this long ends the body; also the grace
    min_rate: float  # bytes/s on average after the grace (--body-min-rate-kib-s)
    total_s: float  # the whole body within this (--request-timeout-s, or the client's deadline if shorter)
    clients_deadline: bool = False  # total_s is the client's X-Reward-Deadline-S, not the server's limit


class ArrivedBytes(Protocol):
    """Where arrived bytes are admitted (reward_server.core.admission.Admission)."""

    def take_arrived(self, n: int, held: int) -> None: ...

    def give_bytes(self, n: int) -> None: ...


def _buffer(length: int | None) -> bytearray | mmap.mmap:
    if length is not None and length >= MAPPED_FROM_BYTES:
        return mmap.mmap(-1, length)  # pages materialise when written: memory follows arrival
    return bytearray(length) if length is not None else bytearray()


def _address(buffer: mmap.mmap) -> int:
    """Where a mapped buffer starts (the mapping lives as long as the buffer object)."""
    view = ctypes.c_char.from_buffer(buffer)  # an export, dropped at once
    try:
        return ctypes.addressof(view)
    finally:
        del view


class BodyReader:
    def __init__(self, receive: Receive, length: int | None, limits: BodyLimits, admission: ArrivedBytes | None = None):
        max_bytes = limits.max_bytes
        if length is not None and length > max_bytes:
            raise BodyTooLarge(f"body of {length} bytes exceeds the limit of {max_bytes} bytes (--max-body-mb)")
        self._receive = receive
        self.length = length
        self.limits = limits
        self.max_bytes = max_bytes
        self._admission = admission
        self.held = 0  # bytes admitted against --max-inflight-mb, given back by close()
        self.buffer = _buffer(length)
        self._address = _address(self.buffer) if isinstance(self.buffer, mmap.mmap) else None
        self._prefault = Prefault(self.buffer, self._address) if self._address is not None else None
        self.received = 0
        self.started = time.monotonic()
        self.done = False
        self.error: BaseException | None = None
        self.disconnected = asyncio.Event()
        # who waits for how many bytes (a heap): each arrival wakes only the waiters whose bytes are
        # all there. A raw batch of 64 episodes has 64 waiters and 768 arrivals of 256 KiB: waking
        # every waiter on every arrival was some 25k task switches on the event loop per batch
        self._waiters: list[tuple[float, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._task: asyncio.Task | None = None

    def start(self) -> BodyReader:
        self._task = asyncio.create_task(self._run(), name="body-reader")
        return self

    def _by_rate(self) -> float:
        lim = self.limits
        return self.started + lim.idle_timeout_s + self.received / lim.min_rate

    def _deadline(self) -> float:
        """When the body is late: after the grace, it must keep up with the minimum rate, so each
        byte extends the deadline by 1/rate only (a trickle cannot hold the connection)."""
        return min(self._by_rate(), self.started + self.limits.total_s)

    def _late(self) -> BodyTimeout | BodyDeadline:
        """Why the body is late: the deadline that bound (the timer may fire a hair before it)."""
        lim = self.limits
        elapsed = time.monotonic() - self.started
        total = self.started + lim.total_s <= self._by_rate()
        if total and lim.clients_deadline:
            return BodyDeadline(
                f"the client's deadline of {lim.total_s:g} s (X-Reward-Deadline-S) passed while its body was "
                f"arriving ({self.received} of {self.length if self.length is not None else '?'} bytes received "
                f"in {elapsed:.3g} s); a retry with a longer deadline can succeed"
            )
        if total:
            why = f"the body did not arrive within {lim.total_s:g} s (--request-timeout-s)"
        else:
            why = (
                f"the body arrived at {self.received / elapsed / 1024:.3g} KiB/s, below the "
                f"{lim.min_rate / 1024:g} KiB/s required after the first {lim.idle_timeout_s:g} s "
                "(--body-min-rate-kib-s)"
            )
        return BodyTimeout(f"{why} ({self.received} bytes received in {elapsed:.0f} s)")

    async def _run(self) -> None:
        try:
            while not self.done:
                idle_s = self.limits.idle_timeout_s
                late_in = self._deadline() - time.monotonic()
                if late_in <= 0:
                    raise self._late()
                try:
                    # not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the
                    # message does (close() on an empty body), and this task then never ends
                    async with asyncio.timeout(min(idle_s, late_in)):
                        message = await self._receive()
                except TimeoutError:
                    if late_in <= idle_s:
                        raise self._late() from None
                    raise BodyTimeout(f"no body data for {idle_s:g} s ({self.received} bytes received)") from None
                if message["type"] == "http.disconnect":
                    self.disconnected.set()
                    raise ClientGone("the client disconnected while sending its body")
                self._add(message.get("body", b""))
                if not message.get("more_body", False):
                    if self.length is not None and self.received != self.length:
                        raise ClientGone(f"body ended after {self.received} of {self.length} bytes")
                    self.done = True
                self._wake()
            while True:  # the body is complete: from now on only a disconnect can arrive
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    self.disconnected.set()
                    return
        except BaseException as exc:
            self.error = exc
            if not isinstance(exc, asyncio.CancelledError):
                # a refused or broken body gives its bytes back now, not when its handler gets to
                # close it: concurrent uploads refused in the same instant would otherwise all be
                # refused (each sees the others' bytes), and none would be served
                self.release()
            self._wake()
            if not isinstance(exc, asyncio.CancelledError):
                self.disconnected.set()  # a broken body ends the request like a disconnect

    def _add(self, chunk: bytes) -> None:
        if not chunk:
            return
        end = self.received + len(chunk)
        if end > self.max_bytes or (self.length is not None and end > self.length):
            raise BodyTooLarge(f"body exceeds {self.length or self.max_bytes} bytes")
        if self._admission is not None:
            self._admission.take_arrived(len(chunk), self.held)
            self.held += len(chunk)
        if self._prefault is not None:
            self._prefault.arrived(end)  # the next pages, faulted in while this chunk is copied
        if self._address is not None and type(chunk) is bytes:
            # the copy without the interpreter lock (ctypes drops it): the input threads run meanwhile
            ctypes.memmove(self._address + self.received, chunk, len(chunk))
        elif self.length is not None:
            self.buffer[self.received : end] = chunk
        else:
            self.buffer += chunk
        self.received = end

    def _wake(self) -> None:
        """Wake the waiters whose bytes have arrived; all of them once the body ended or broke."""
        ended = self.done or self.error is not None
        while self._waiters and (ended or self._waiters[0][0] <= self.received):
            future = heapq.heappop(self._waiters)[2]
            if not future.done():
                future.set_result(None)

    async def _until(self, nbytes: float) -> None:
        """Return once nbytes have arrived or the body ended or broke (the callers check which)."""
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (nbytes, next(self._order), future))
        await future

    async def wait_for(self, nbytes: int) -> memoryview:
        """The first nbytes of the body, once they have arrived."""
        if self.length is None:  # a growing buffer cannot be viewed before it is complete
            await self.read_all()
        while self.received < nbytes and not self.done:
            if self.error is not None:
                raise self.error
            await self._until(nbytes)
        if self.received < nbytes:
            raise ValueError(f"the body has {self.received} bytes, {nbytes} were expected")
        return memoryview(self.buffer)[:nbytes]

    async def read_all(self) -> memoryview:
        while not self.done:
            if self.error is not None:
                raise self.error
            await self._until(float("inf"))
        return memoryview(self.buffer)[: self.received]

    async def close(self) -> None:
        """The request is answered (or given up): stop listening, give the bytes back, unmap the body."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except BaseException:
                pass
        self.release()
        # The reader's task ends by raising (this cancel, or the body's own error), and that exception's
        # traceback holds the task's frame, which holds this reader: a cycle through the task and
        # `error` that kept every body mapped until the cycle collector ran, and made that run pay
        # for unmapping it on the event loop (a collection 26 ms against 3.7 ms without it, on an
        # H200 host with the hook's 192 MiB batches). Nothing reads them after close.
        self.error = None
        buffer, self.buffer = self.buffer, bytearray()
        self._prefault = None
        if isinstance(buffer, mmap.mmap):
            unmap_soon(buffer)

    def release(self) -> None:
        """Give the admitted bytes back (the buffer itself goes when the last view of it does)."""
        if self._admission is not None and self.held:
            self._admission.give_bytes(self.held)
        self.held = 0


async def cancel_on_disconnect(work: Awaitable, reader: BodyReader):
    """Run `work`; if the client disconnects first, cancel it (aborting its engine requests)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(reader.disconnected.wait())
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:
        pass
    if reader.error is not None and not isinstance(reader.error, ClientGone | asyncio.CancelledError):
        raise reader.error
    raise ClientGone("the client disconnected before its answer was ready")
