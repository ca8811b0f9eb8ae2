"""HTTP clients for the reward server: pooled connections, retries with backoff, a deadline.

Retried: connection errors (refused, reset, cut before the answer), timeouts, and 429 / 502 /
503 / 504 (honouring Retry-After), with jittered exponential backoff, until the overall deadline.
In a batch, items whose error says `retryable` (the engine failed that request, its deadline
passed, the server was full) are sent again, alone, under the same backoff and the same deadline;
the answer keeps one entry per episode, in order. Never retried: other 4xx (the request itself is
wrong; sending it again cannot help), 500, and items whose error is not retryable.

Every answer is checked before it is believed (`check_batch`): one item per episode, indices
exactly 0..n-1, each item a response or an error, scores and curve points finite in [0, 1].
Anything else (a faulty server or proxy) is a protocol error: counted (`stats()`), retried within
the deadline like a lost connection, never a reward.

Time: a call never outlives `deadline_s`. Each attempt has one bound on the whole exchange
(sending the body, waiting, reading the answer), the smaller of `timeout_s` and what is left of
the deadline, enforced on every socket read and write (not httpx's per-read timeout, which a
slowly dripped answer renews forever). The server is told the bound (header `X-Reward-Deadline-S`,
a little less, so its answer still arrives): it ends the request there with what is done, the
rest as retryable item errors, instead of working on for a client that has left.

Size: a batch is cut into requests the server accepts: at most its advertised item count and
body bytes per transport (`HealthResponse.limits`, learned from /health), and a batch still
refused as too large (413, from the server or a proxy) is halved and sent again, so no batch size
is refused.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import httpcore
import httpx

from reward_client.answers import (
    batch_reader,
    check_batch,
    check_response,
    parse_answer,
    raise_for_answer,
    score_reader,
)
from reward_client.errors import (
    RewardClientError,
    RewardProtocolError,
    RewardRequestError,
    RewardServerError,
    RewardUnavailable,
)
from reward_protocol import raw_batch
from reward_protocol.score import (
    DEADLINE_HEADER,
    MAX_BATCH_ITEMS,
    RETRYABLE_STATUSES,
    BatchItem,
    HealthResponse,
    ScoreOptions,
    ScoreRequest,
    ScoreResponse,
    ServerLimits,
)

logger = logging.getLogger(__name__)

RETRY_STATUS = RETRYABLE_STATUSES
HEALTH_TIMEOUT_S = 10.0  # one /health probe; a server that cannot answer it within this is not ready
T = TypeVar("T")

# re-exported: callers import these from here
__all__ = [
    "AsyncRewardClient",
    "RetryPolicy",
    "RewardClient",
    "RewardClientError",
    "RewardProtocolError",
    "RewardRequestError",
    "RewardServerError",
    "RewardUnavailable",
    "check_batch",
    "check_response",
]


@dataclass(frozen=True)
class RetryPolicy:
    deadline_s: float = 300.0  # overall, across all attempts
    timeout_s: float | None = None  # one attempt's bound; None: the rest of the deadline
    backoff_initial_s: float = 0.5  # also the least pause, whatever Retry-After says
    backoff_max_s: float = 10.0
    connect_timeout_s: float = 5.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:  # floored: `Retry-After: 0` must not become a busy loop
            wait = min(max(retry_after, self.backoff_initial_s), self.backoff_max_s)
            return wait * (1 + random.uniform(0, 0.25))
        # the exponent is capped: 2**1024 is past a float (OverflowError after ~1023 attempts)
        base = min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** min(attempt, 64))
        return random.uniform(base / 2, base)  # jitter spreads out many envs retrying together


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return max(0.0, seconds) if seconds is not None and math.isfinite(seconds) else None


def _dumps(body: dict) -> bytes:
    """JSON bytes of a request body; orjson when installed (10x faster on megabytes of frames)."""
    try:
        import orjson

        return orjson.dumps(body)
    except ImportError:
        return json.dumps(body).encode()


_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class _Body:
    """A request body as buffers, sent in chunks of at most 4 MiB.

    httpx handed one large bytes object sends it about 4x slower than the same bytes as chunks
    (measured: 192 MiB in 1.7 s vs 0.4 s on loopback), and chunks let the raw batch go out
    straight from the episodes' arrays. Built once per call, replayed on every retry."""

    parts: tuple[bytes | memoryview, ...]
    content_type: str

    @classmethod
    def json(cls, body: dict) -> _Body:
        return cls((_dumps(body),), "application/json")

    @property
    def length(self) -> int:
        return sum(memoryview(p).nbytes for p in self.parts)

    def headers(self) -> dict[str, str]:
        return {"content-type": self.content_type, "content-length": str(self.length)}

    def stream(self):
        for part in self.parts:
            view = memoryview(part).cast("B")
            for start in range(0, len(view), _CHUNK):
                yield view[start : start + _CHUNK]

    async def astream(self):
        for chunk in self.stream():
            yield chunk


# frames [T, H, W, 3] uint8, several named camera views of them, or a server-side video path
Episode = tuple[ScoreOptions, raw_batch.Video]


# --- time: one bound per attempt, on every read and write --------------------------------------

# When the attempt running in this thread (or task) must end, in time.monotonic() seconds.
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


def _bounded_transport() -> httpx.HTTPTransport:
    """httpx's transport with connections that honour the attempt's bound (_BoundedStream)."""
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if backend is None:  # a different httpx: per-read timeouts still hold, the total bound does not
        logger.warning("this httpx has no connection pool to bound; an attempt is bounded per read only")
        return transport
    pool._network_backend = _BoundedBackend(backend)
    return transport


def _server_deadline(bound: float) -> str:
    """What the server is told: the attempt's bound less the time its answer needs to arrive."""
    return f"{max(bound - min(1.0, bound / 10), 0.001):.3f}"


# --- sizes: requests the server accepts ---------------------------------------------------------


class _JsonItems:
    """ScoreRequests as one JSON body or several: each item serialized once, its size exact."""

    content_type = "application/json"
    overhead = len(b'{"requests":[]}')

    def __init__(self, requests: Sequence[ScoreRequest]):
        self.parts = [_dumps(r.model_dump(mode="json", exclude_none=True)) for r in requests]
        self.sizes = [len(p) + 1 for p in self.parts]  # + its comma
        self.points = [r.progress_points for r in requests]  # what each answer must carry (check_batch)

    def limit(self, limits: ServerLimits) -> int:
        return limits.max_json_body_bytes

    def body(self, lo: int, hi: int) -> _Body:
        parts: list[bytes] = [b'{"requests":[']
        for k, part in enumerate(self.parts[lo:hi]):
            parts += [b",", part] if k else [part]
        return _Body((*parts, b"]}"), self.content_type)


class _RawItems:
    """(options, frames | video path) pairs as raw batch bodies (reward_protocol/raw_batch.py)."""

    content_type = raw_batch.CONTENT_TYPE
    overhead = raw_batch.PREFIX_BYTES + len(b'{"requests":[]}')

    def __init__(self, episodes: Sequence[Episode]):
        self.episodes = [(options, raw_batch.checked_video(video)) for options, video in episodes]
        self.sizes = [raw_batch.item_nbytes(options, video) for options, video in self.episodes]
        self.points = [options.progress_points for options, _ in self.episodes]

    def limit(self, limits: ServerLimits) -> int:
        return limits.max_raw_body_bytes

    def body(self, lo: int, hi: int) -> _Body:
        return _Body(tuple(raw_batch.encode(self.episodes[lo:hi]).parts), self.content_type)


def _json_batch(requests: list[ScoreRequest]) -> _Body:
    items = _JsonItems(requests)
    return items.body(0, len(requests))


def _raw_batch(episodes: list[Episode]) -> _Body:
    items = _RawItems(episodes)
    return items.body(0, len(episodes))


def _pack(
    sizes: Sequence[int], lo: int, hi: int, overhead: int, max_bytes: int, max_items: int
) -> list[tuple[int, int]]:
    """[lo, hi) cut into consecutive runs within max_items and max_bytes (an item larger than
    max_bytes alone is a run of its own: the server will say why it refuses it)."""
    runs, start, size = [], lo, overhead
    for i in range(lo, hi):
        if i > start and (i - start >= max_items or size + sizes[i] > max_bytes):
            runs.append((start, i))
            start, size = i, overhead
        size += sizes[i]
    if hi > start:
        runs.append((start, hi))
    return runs


@dataclass
class _Part:
    """One request of a call: items [lo, hi) of the call's items."""

    lo: int
    hi: int
    body: _Body


def _too_large(exc: RewardRequestError) -> bool:
    """A whole batch refused for its size: the server's body_too_large / request_too_large, or a
    proxy's own 413 (nginx's client_max_body_size answers HTML)."""
    return exc.status == 413


class _Base:
    """One server, or several serving the same backend (replicas): calls go round-robin, a
    failed attempt is retried on the next one, and a batch can be split across them."""

    def __init__(self, base_url: str | Sequence[str], policy: RetryPolicy | None, api_key: str | None):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("no reward server URL given")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.base_url = self.base_urls[0] if len(self.base_urls) == 1 else ", ".join(self.base_urls)
        self.policy = policy or RetryPolicy()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.attempts = 0  # requests sent, retries included (for logs and tests)
        self.protocol_errors = 0  # answers that could not be right (check_batch), each retried
        self.split_requests = 0  # requests beyond one per call because a batch exceeded the server's limits
        self.limits: ServerLimits | None = None  # the server's, once /health said them
        self._limits_asked = False
        self._count_lock = threading.Lock()
        self._turn = itertools.count()

    def stats(self) -> dict[str, int]:
        """Counters since the client was built: requests sent, protocol errors, extra requests from splitting."""
        return {
            "attempts": self.attempts,
            "protocol_errors": self.protocol_errors,
            "split_requests": self.split_requests,
        }

    def _endpoint(self) -> str:
        return self.base_urls[next(self._turn) % len(self.base_urls)]

    def _plan(self, items: _JsonItems | _RawItems, split: bool) -> list[_Part]:
        """The requests one round of a call sends: a share per replica when splitting, each cut
        to the server's limits (item count, body bytes) when it has said them."""
        count = len(items.sizes)
        shares = min(len(self.base_urls), count) if split else 1
        size = -(-count // max(shares, 1))
        max_items, max_bytes = MAX_BATCH_ITEMS, 1 << 62
        if self.limits is not None:
            max_items = min(max_items, self.limits.max_batch_items)
            max_bytes = items.limit(self.limits)
        runs = []
        for lo in range(0, count, size):
            runs += _pack(items.sizes, lo, min(lo + size, count), items.overhead, max_bytes, max_items)
        with self._count_lock:
            self.split_requests += max(0, len(runs) - shares)
        return [_Part(lo, hi, items.body(lo, hi)) for lo, hi in runs]

    def _ask_limits(self) -> str | None:
        """The URL to ask /health once for the limits before a first batch, when unknown (a
        server that does not say them, or cannot answer now, is asked no more: a body it finds
        too large is halved instead)."""
        if self.limits is not None or self._limits_asked:
            return None
        self._limits_asked = True
        return self.base_urls[0]

    def _learned(self, health: HealthResponse) -> HealthResponse:
        if health.limits is not None:
            self.limits = health.limits
        return health

    def _ready(self, health: HealthResponse) -> bool:
        """True when the server serves; a server that reports `failed` will not recover by waiting."""
        if health.status == "failed" and len(self.base_urls) == 1:
            raise RewardUnavailable(f"reward server at {self.base_url} failed: {health.detail}")
        return health.status == "ok"

    def _not_ready(self, timeout_s: float, last: str) -> RewardUnavailable:
        return RewardUnavailable(f"reward server at {self.base_url} not ready after {timeout_s:g} s (last: {last})")

    def _timeout(self, bound: float | None = None) -> httpx.Timeout:
        total = bound if bound is not None else self.policy.timeout_s
        connect = self.policy.connect_timeout_s if total is None else min(total, self.policy.connect_timeout_s)
        return httpx.Timeout(total, connect=connect)

    def _protocol_error(self, exc: RewardProtocolError, path: str) -> str:
        with self._count_lock:
            self.protocol_errors += 1
        logger.warning("reward server answered %s with an impossible answer (%s); retrying", path, exc)
        return f"protocol error: {exc}"


class _Attempts:
    """Counts failed attempts of one call and says how long to wait before the next one."""

    def __init__(self, client: _Base, path: str, deadline: float | None = None):
        self.client, self.path = client, path
        self.deadline = deadline if deadline is not None else time.monotonic() + client.policy.deadline_s
        self.count = 0
        self.last = "no attempt"
        # the latest failure other than the last one: an attempt the deadline cut short ends the
        # call with a timeout, which must not hide why the attempts before it failed
        self.before: str | None = None

    def _unavailable(self) -> RewardUnavailable:
        before = f"; before it: {self.before}" if self.before else ""
        return RewardUnavailable(
            f"no answer from {self.client.base_url}{self.path} within {self.client.policy.deadline_s:g} s "
            f"({self.count} attempts; last: {self.last}{before})"
        )

    def bound(self) -> float:
        """The next attempt's time: timeout_s, never past the deadline."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._unavailable()
        timeout = self.client.policy.timeout_s
        return left if timeout is None else min(timeout, left)

    def failed(self, retry_after: float | None, what: str) -> float:
        self.count += 1
        if what != self.last and self.count > 1:
            self.before = self.last
        self.last = what
        pause = self.client.policy.delay(self.count, retry_after)
        if time.monotonic() + pause >= self.deadline:
            raise self._unavailable()
        logger.debug("retrying %s in %.2f s (%s)", self.path, pause, what)
        return pause


def _final(response: httpx.Response) -> bool:
    """True if this answer ends the call (success, or an error raised here); False to retry."""
    if response.status_code in RETRY_STATUS:
        return False
    raise_for_answer(response)
    return True


class _ItemRetries:
    """One batch call: which episodes still need an answer, and the answers so far.

    Items that failed retryably are sent again (alone) until they succeed, fail for good, or the
    call's deadline passes; then the last error stays in the episode's place."""

    def __init__(self, client: _Base, count: int):
        self.attempts = _Attempts(client, "/score/batch")
        self.results: list[BatchItem | None] = [None] * count
        self.pending = list(range(count))
        self.rounds = 0

    def take(self, items: list[BatchItem]) -> None:
        """Record one round's answers (checked, in the order of `pending`)."""
        retry = []
        for episode, item in zip(self.pending, items, strict=True):
            self.results[episode] = item.model_copy(update={"index": episode})
            if item.error is not None and item.error.retryable:
                retry.append(episode)
        self.pending = retry
        self.rounds += 1

    def pause(self) -> float | None:
        """Seconds to wait before the next round, or None when the call is over."""
        if not self.pending:
            return None
        kinds = sorted({self.results[i].error.type for i in self.pending})
        try:
            return self.attempts.failed(None, f"{len(self.pending)} items failed retryably ({', '.join(kinds)})")
        except RewardUnavailable as exc:
            logger.warning("%s; answering their last errors", exc)
            return None

    def answer(self) -> list[BatchItem]:
        return [item for item in self.results if item is not None]


def _halves(part: _Part, items: _JsonItems | _RawItems) -> list[_Part]:
    mid = (part.lo + part.hi) // 2
    return [_Part(part.lo, mid, items.body(part.lo, mid)), _Part(mid, part.hi, items.body(mid, part.hi))]


class RewardClient(_Base):
    """Blocking client; one instance per process (it pools connections)."""

    def __init__(self, base_url: str | Sequence[str], policy: RetryPolicy | None = None, api_key: str | None = None):
        super().__init__(base_url, policy, api_key)
        self._http = httpx.Client(timeout=self._timeout(), headers=self.headers, transport=_bounded_transport())

    def _request(self, path: str, body: _Body, read: Callable[[httpx.Response], T], deadline: float | None = None) -> T:
        attempts = _Attempts(self, path, deadline)
        while True:
            bound = attempts.bound()
            self.attempts += 1
            token = _ATTEMPT_END.set(time.monotonic() + bound)
            try:
                response = self._http.post(
                    self._endpoint() + path,
                    content=body.stream(),
                    headers={**body.headers(), DEADLINE_HEADER: _server_deadline(bound)},
                    timeout=self._timeout(bound),
                )
                if _final(response):
                    return read(response)
                pause = attempts.failed(_retry_after(response), f"HTTP {response.status_code}")
            except httpx.TransportError as exc:
                pause = attempts.failed(None, f"{type(exc).__name__}: {exc}")
            except RewardProtocolError as exc:
                pause = attempts.failed(None, self._protocol_error(exc, path))
            finally:
                _ATTEMPT_END.reset(token)
            time.sleep(pause)

    def score(self, request: ScoreRequest) -> ScoreResponse:
        body = _Body.json(request.model_dump(mode="json", exclude_none=True))
        return self._request("/score", body, score_reader(request.progress_points))

    def _batch(self, part: _Part, items: _JsonItems | _RawItems, deadline: float) -> list[BatchItem]:
        """One request's items (indices of the call); a body the server finds too large is halved."""
        try:
            answer = self._request("/score/batch", part.body, batch_reader(items.points[part.lo : part.hi]), deadline)
        except RewardRequestError as exc:
            if not (_too_large(exc) and part.hi - part.lo > 1):
                raise
            logger.warning("reward server refused %d items as too large (%s); sending halves", part.hi - part.lo, exc)
            with self._count_lock:
                self.split_requests += 1
            return [item for half in _halves(part, items) for item in self._batch(half, items, deadline)]
        return [item.model_copy(update={"index": item.index + part.lo}) for item in answer]

    def _send(self, items: _JsonItems | _RawItems, split: bool, deadline: float) -> list[BatchItem]:
        parts = self._plan(items, split)
        if len(parts) == 1:
            return self._batch(parts[0], items, deadline)
        with ThreadPoolExecutor(len(parts)) as pool:
            answers = pool.map(lambda p: self._batch(p, items, deadline), parts)
            return [item for answer in answers for item in answer]

    def _split(self, items: Sequence, split: bool, kind: type[_JsonItems] | type[_RawItems]) -> list[BatchItem]:
        if not items:
            return []
        url = self._ask_limits()
        if url is not None:
            try:
                self.health(url)
            except (httpx.HTTPError, RewardClientError) as exc:
                logger.info("reward server limits unknown (%s): a batch it refuses as too large is halved", exc)
        calls = _ItemRetries(self, len(items))
        while True:
            try:
                pending = kind([items[i] for i in calls.pending])
                answer = self._send(pending, split, calls.attempts.deadline)
            except RewardClientError:
                if calls.rounds == 0:
                    raise
                logger.warning(
                    "resending %d failed items got no answer; answering their last errors", len(calls.pending)
                )
                return calls.answer()
            calls.take(answer)
            pause = calls.pause()
            if pause is None:
                return calls.answer()
            time.sleep(pause)

    def score_batch(self, requests: Sequence[ScoreRequest], split: bool = True) -> list[BatchItem]:
        """Score many episodes (JSON bodies); with several servers the batch is split across them."""
        return self._split(requests, split, _JsonItems)

    def score_episodes(self, episodes: Sequence[Episode], split: bool = True) -> list[BatchItem]:
        """Score many episodes given as (options, frames or server-side video path), in one raw
        batch body per server: frames travel as bytes straight from their arrays (the fastest
        way to send an episode; see reward_protocol/raw_batch.py)."""
        return self._split(episodes, split, _RawItems)

    def health(self, url: str | None = None) -> HealthResponse:
        response = self._http.get((url or self._endpoint()) + "/health", timeout=self._timeout(HEALTH_TIMEOUT_S))
        return self._learned(parse_answer(HealthResponse, response))

    def wait_until_ready(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> HealthResponse:
        """Poll /health (each server in turn) until one says ok; raise RewardUnavailable after timeout_s."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                health = self.health()
                if self._ready(health):
                    return health
                last = health.status
            except (httpx.TransportError, RewardServerError) as exc:
                last = type(exc).__name__
            time.sleep(poll_s)
        raise self._not_ready(timeout_s, last)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRewardClient(_Base):
    """asyncio client with the same behaviour as RewardClient."""

    def __init__(self, base_url: str | Sequence[str], policy: RetryPolicy | None = None, api_key: str | None = None):
        super().__init__(base_url, policy, api_key)
        self._http = httpx.AsyncClient(timeout=self._timeout(), headers=self.headers)

    async def _request(
        self, path: str, body: _Body, read: Callable[[httpx.Response], T], deadline: float | None = None
    ) -> T:
        attempts = _Attempts(self, path, deadline)
        while True:
            bound = attempts.bound()
            self.attempts += 1
            try:
                async with asyncio.timeout(bound):  # the whole exchange, not each read
                    response = await self._http.post(
                        self._endpoint() + path,
                        content=body.astream(),
                        headers={**body.headers(), DEADLINE_HEADER: _server_deadline(bound)},
                        timeout=self._timeout(bound),
                    )
                if _final(response):
                    return read(response)
                pause = attempts.failed(_retry_after(response), f"HTTP {response.status_code}")
            except TimeoutError:
                pause = attempts.failed(None, f"no complete answer within the attempt's {bound:.3g} s")
            except httpx.TransportError as exc:
                pause = attempts.failed(None, f"{type(exc).__name__}: {exc}")
            except RewardProtocolError as exc:
                pause = attempts.failed(None, self._protocol_error(exc, path))
            await asyncio.sleep(pause)

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        body = _Body.json(request.model_dump(mode="json", exclude_none=True))
        return await self._request("/score", body, score_reader(request.progress_points))

    async def _batch(self, part: _Part, items: _JsonItems | _RawItems, deadline: float) -> list[BatchItem]:
        try:
            reader = batch_reader(items.points[part.lo : part.hi])
            answer = await self._request("/score/batch", part.body, reader, deadline)
        except RewardRequestError as exc:
            if not (_too_large(exc) and part.hi - part.lo > 1):
                raise
            logger.warning("reward server refused %d items as too large (%s); sending halves", part.hi - part.lo, exc)
            with self._count_lock:
                self.split_requests += 1
            halves = await asyncio.gather(*(self._batch(h, items, deadline) for h in _halves(part, items)))
            return [item for half in halves for item in half]
        return [item.model_copy(update={"index": item.index + part.lo}) for item in answer]

    async def _send(self, items: _JsonItems | _RawItems, split: bool, deadline: float) -> list[BatchItem]:
        answers = await asyncio.gather(*(self._batch(p, items, deadline) for p in self._plan(items, split)))
        return [item for answer in answers for item in answer]

    async def _split(self, items: Sequence, split: bool, kind: type[_JsonItems] | type[_RawItems]) -> list[BatchItem]:
        if not items:
            return []
        url = self._ask_limits()
        if url is not None:
            try:
                await self.health(url)
            except (httpx.HTTPError, RewardClientError) as exc:
                logger.info("reward server limits unknown (%s): a batch it refuses as too large is halved", exc)
        calls = _ItemRetries(self, len(items))
        while True:
            try:
                pending = kind([items[i] for i in calls.pending])
                answer = await self._send(pending, split, calls.attempts.deadline)
            except RewardClientError:
                if calls.rounds == 0:
                    raise
                logger.warning(
                    "resending %d failed items got no answer; answering their last errors", len(calls.pending)
                )
                return calls.answer()
            calls.take(answer)
            pause = calls.pause()
            if pause is None:
                return calls.answer()
            await asyncio.sleep(pause)

    async def score_batch(self, requests: Sequence[ScoreRequest], split: bool = True) -> list[BatchItem]:
        """Score many episodes (JSON bodies); with several servers the batch is split across them."""
        return await self._split(requests, split, _JsonItems)

    async def score_episodes(self, episodes: Sequence[Episode], split: bool = True) -> list[BatchItem]:
        """Score (options, frames or server-side video path) pairs in raw batch bodies (see RewardClient)."""
        return await self._split(episodes, split, _RawItems)

    async def health(self, url: str | None = None) -> HealthResponse:
        response = await self._http.get((url or self._endpoint()) + "/health", timeout=self._timeout(HEALTH_TIMEOUT_S))
        return self._learned(parse_answer(HealthResponse, response))

    async def wait_until_ready(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> HealthResponse:
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                health = await self.health()
                if self._ready(health):
                    return health
                last = health.status
            except (httpx.TransportError, RewardServerError) as exc:
                last = type(exc).__name__
            await asyncio.sleep(poll_s)
        raise self._not_ready(timeout_s, last)

    async def aclose(self) -> None:
        await self._http.aclose()
