"""Reading a request body from ASGI, progressively, and noticing when the client leaves.

The body lands in one buffer allocated from Content-Length, so episodes can be prepared from
views of it while the rest is still arriving (`wait_for`), with no join or copy. A sender that
stalls longer than the idle timeout is cut off; after the body, the reader keeps listening so
the handler can be cancelled (and its engine work aborted) when the client disconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


class BodyTooLarge(ValueError):
    pass


class LengthRequired(ValueError):
    pass


class BodyTimeout(Exception):
    """The client stopped sending its body (408). Not a TimeoutError: handlers that turn the
    server's own timeouts into 504 must never see the client's stall as one."""


class ClientGone(ConnectionError):
    """The client disconnected before its answer was ready."""


class BodyReader:
    def __init__(self, receive: Receive, length: int | None, max_bytes: int, idle_timeout_s: float):
        if length is not None and length > max_bytes:
            raise BodyTooLarge(f"body of {length} bytes exceeds the limit of {max_bytes} bytes (--max-body-mb)")
        self._receive = receive
        self.length = length
        self.max_bytes = max_bytes
        self.idle_timeout_s = idle_timeout_s
        self.buffer = bytearray(length) if length is not None else bytearray()
        self.received = 0
        self.done = False
        self.error: BaseException | None = None
        self.disconnected = asyncio.Event()
        self._progress = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> BodyReader:
        self._task = asyncio.create_task(self._run(), name="body-reader")
        return self

    async def _run(self) -> None:
        try:
            while not self.done:
                try:
                    # not asyncio.wait_for: on Python 3.11 it swallows a cancel that arrives as the
                    # message does (close() on an empty body), and this task then never ends
                    async with asyncio.timeout(self.idle_timeout_s):
                        message = await self._receive()
                except TimeoutError:
                    raise BodyTimeout(
                        f"no body data for {self.idle_timeout_s:g} s ({self.received} bytes received)"
                    ) from None
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
            self._wake()
            if not isinstance(exc, asyncio.CancelledError):
                self.disconnected.set()  # a broken body ends the request like a disconnect

    def _add(self, chunk: bytes) -> None:
        if not chunk:
            return
        end = self.received + len(chunk)
        if end > self.max_bytes or (self.length is not None and end > self.length):
            raise BodyTooLarge(f"body exceeds {self.length or self.max_bytes} bytes")
        if self.length is not None:
            self.buffer[self.received : end] = chunk
        else:
            self.buffer += chunk
        self.received = end

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def wait_for(self, nbytes: int) -> memoryview:
        """The first nbytes of the body, once they have arrived."""
        if self.length is None:  # a growing buffer cannot be viewed before it is complete
            await self.read_all()
        while self.received < nbytes and not self.done:
            if self.error is not None:
                raise self.error
            await self._progress.wait()
        if self.received < nbytes:
            raise ValueError(f"the body has {self.received} bytes, {nbytes} were expected")
        return memoryview(self.buffer)[:nbytes]

    async def read_all(self) -> memoryview:
        while not self.done:
            if self.error is not None:
                raise self.error
            await self._progress.wait()
        return memoryview(self.buffer)[: self.received]

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass


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
