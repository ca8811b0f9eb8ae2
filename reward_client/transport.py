"""What the client's logic asks of the network, and the two ways it is done (blocking, asyncio).

The client's logic (reward_client.calls) is written once, as generators that yield effects:

- `Exchange`: send this request to this URL and read its answer, all within `bound` seconds and
  `cap` bytes; the answer (an httpx.Response, its body read) or the exception comes back;
- `Sleep`: pause (backoff between attempts);
- `Together`: run these calls at once (parts of a batch, at most `limit` in flight); their
  results come back in order, or the first of their exceptions in order.

`SyncTransport` performs them with an httpx.Client and threads, `AsyncTransport` with an
httpx.AsyncClient and tasks. Nothing else differs between RewardClient and AsyncRewardClient.

Time: an Exchange's bound holds for the whole exchange (sending the body, waiting, reading the
answer). Blocking: every socket read and write of the attempt ends by the bound (_BoundedStream;
httpx's own timeouts restart with every read, so an answer dripped a byte at a time would never
end). asyncio: asyncio.timeout around the exchange.

Size: the answer is read as it arrives and no further than the Exchange's cap
(reward_client.bounded_answers).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpcore
import httpx

from reward_client.bodies import Body
from reward_client.bounded_answers import AnswerMeter

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Exchange:
    """One HTTP request and its answer, within `bound` seconds and `cap` bytes of answer."""

    method: str
    url: str
    bound: float
    cap: int
    connect_s: float
    body: Body | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {**(self.body.headers() if self.body is not None else {}), **self.extra_headers}

    def request(self, http: httpx.Client | httpx.AsyncClient, content) -> httpx.Request:
        """The request on `http`, its body as `content` (the body's chunks, as that client iterates them)."""
        timeout = httpx.Timeout(self.bound, connect=min(self.bound, self.connect_s))
        return http.build_request(self.method, self.url, content=content, headers=self.headers, timeout=timeout)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Together:
    """Calls run at once, at most `limit` in flight."""

    calls: tuple[Generator, ...]
    limit: int


Effect = Exchange | Sleep | Together
Call = Generator[Effect, Any, T]  # a piece of the client's logic: yields effects, returns its result


@dataclass(frozen=True)
class _Finished:
    value: Any


@dataclass(frozen=True)
class _Outcome:
    """What an effect came to: a value to send into the call, or an exception to raise in it."""

    value: Any = None
    error: Exception | None = None

    def resume(self, call: Generator) -> Effect | _Finished:
        """The call's next effect, or _Finished with what it returned."""
        try:
            return call.throw(self.error) if self.error is not None else call.send(self.value)
        except StopIteration as stop:
            return _Finished(stop.value)

    @classmethod
    def of(cls, perform: Callable[[Effect], Any], effect: Effect) -> _Outcome:
        try:
            return cls(perform(effect))
        except Exception as exc:  # handed to the call, which decides (retry, raise)
            return cls(error=exc)

    @classmethod
    async def of_async(cls, perform: Callable[[Effect], Awaitable[Any]], effect: Effect) -> _Outcome:
        try:
            return cls(await perform(effect))
        except Exception as exc:
            return cls(error=exc)


# --- blocking -----------------------------------------------------------------------------------

# When the attempt running in this thread must end, in time.monotonic() seconds.
_ATTEMPT_END: contextvars.ContextVar[float | None] = contextvars.ContextVar("reward_attempt_end", default=None)
_WRITE_SLICE = 256 * 1024  # a write is cut into slices so a slow reader cannot stretch one past the bound


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    end = _ATTEMPT_END.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the attempt's time bound passed")
    return left if timeout is None else min(timeout, left)


class _BoundedStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the current attempt's bound (httpx's own
    timeouts restart with every read: an answer dripped a byte at a time would never end)."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        for start in range(0, len(view), _WRITE_SLICE):
            self._inner.write(view[start : start + _WRITE_SLICE], _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        return _BoundedStream(
            self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout))
        )

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _BoundedBackend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend):
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._inner.connect_tcp(
            host, port, _left(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _BoundedStream(stream)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _BoundedStream(
            self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_transport() -> httpx.HTTPTransport:
    """httpx's transport with connections that honour the attempt's bound (_BoundedStream)."""
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:  # a different httpx: per-read timeouts still hold, the total bound does not
        logger.warning("this httpx has no connection pool to bound; an attempt is bounded per read only")
        return transport
    pool._network_backend = _BoundedBackend(backend)
    return transport


class SyncTransport:
    """Performs a call's effects in this thread (Together: in a pool of threads)."""

    def __init__(self, http: httpx.Client):
        self.http = http

    def run(self, call: Call[T]) -> T:
        outcome = _Outcome()
        while not isinstance(effect := outcome.resume(call), _Finished):
            outcome = _Outcome.of(self._perform, effect)
        return effect.value

    def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Sleep):
            return time.sleep(effect.seconds)
        if isinstance(effect, Together):
            if len(effect.calls) == 1:
                return [self.run(effect.calls[0])]
            with ThreadPoolExecutor(min(len(effect.calls), effect.limit)) as pool:
                return list(pool.map(self.run, effect.calls))
        return self._exchange(effect)

    def _exchange(self, ex: Exchange) -> httpx.Response:
        token = _ATTEMPT_END.set(time.monotonic() + ex.bound)
        try:
            request = ex.request(self.http, ex.body.stream() if ex.body is not None else None)
            response = self.http.send(request, stream=True)
            try:
                meter = AnswerMeter(response, ex.cap)
                for chunk in response.iter_raw() if meter.pending else ():
                    meter.feed(chunk)
                return meter.answer()
            finally:
                response.close()
        finally:
            _ATTEMPT_END.reset(token)


# --- asyncio ------------------------------------------------------------------------------------


class AsyncTransport:
    """Performs a call's effects on the running event loop (Together: as tasks)."""

    def __init__(self, http: httpx.AsyncClient):
        self.http = http

    async def run(self, call: Call[T]) -> T:
        outcome = _Outcome()
        while not isinstance(effect := outcome.resume(call), _Finished):
            outcome = await _Outcome.of_async(self._perform, effect)
        return effect.value

    async def _perform(self, effect: Effect) -> Any:
        if isinstance(effect, Sleep):
            return await asyncio.sleep(effect.seconds)
        if isinstance(effect, Together):
            room = asyncio.Semaphore(effect.limit)

            async def one(call: Call) -> Any:
                async with room:
                    return await self.run(call)

            return list(await asyncio.gather(*(one(call) for call in effect.calls)))
        return await self._exchange(effect)

    async def _exchange(self, ex: Exchange) -> httpx.Response:
        request = ex.request(self.http, ex.body.astream() if ex.body is not None else None)
        try:
            async with asyncio.timeout(ex.bound):  # the whole exchange, not each read
                response = await self.http.send(request, stream=True)
                try:
                    meter = AnswerMeter(response, ex.cap)
                    if meter.pending:
                        async for chunk in response.aiter_raw():
                            meter.feed(chunk)
                    return meter.answer()
                finally:
                    await response.aclose()
        except TimeoutError:
            raise httpx.TimeoutException(
                f"no complete answer within the attempt's {ex.bound:.3g} s", request=request
            ) from None
