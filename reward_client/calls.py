"""The reward client's logic, written once for the blocking and the asyncio client.

Each call (score, a batch, /health, waiting until ready) is a generator that yields what it needs
from the network (reward_client.transport: Exchange, Sleep, Together) and gets back the answer or
the exception; RewardClient and AsyncRewardClient only perform those effects. The four layers of a
batch call, from the outside in:

1. item retries (`_split`): items whose error says `retryable` are sent again until the deadline;
2. parts (`_send`): a share per replica, each cut to the server's limits, at most
   PARTS_IN_FLIGHT requests at once;
3. halving (`_batch`): a part refused as too large (413) is sent again as two halves;
4. attempts (`_request`): one request, retried on connection errors, timeouts, 429/502/503/504,
   answers that cannot be right, and a 408 `body_timeout` after a bound the client set itself.

One deadline covers a call: its /health limits probe, every attempt, every pause.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx

from reward_client.answers import batch_reader, parse_answer, raise_for_answer, score_reader
from reward_client.bodies import Body, Episode, Items, JsonItems, Part, RawItems, halves, pack, part
from reward_client.bounded_answers import HEALTH_ANSWER_BYTES, batch_answer_bytes, item_answer_bytes
from reward_client.errors import (
    RewardClientError,
    RewardProtocolError,
    RewardRequestError,
    RewardServerError,
    RewardUnavailable,
)
from reward_client.transport import Call, Exchange, Sleep, Together
from reward_protocol.score import (
    DEADLINE_HEADER,
    MAX_BATCH_ITEMS,
    RETRYABLE_STATUSES,
    BatchItem,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
    ServerLimits,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

HEALTH_TIMEOUT_S = 10.0  # one /health probe, whole; a server that cannot answer within this is not ready
PARTS_IN_FLIGHT = 16  # requests of one call sent at once, whatever the server's limits make of the batch
MIN_BODY_BYTES = 16 * 1024  # a body limit below this is nonsense (the smallest episode is ~5 KB)


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


def _server_deadline(bound: float) -> str:
    """What the server is told: the attempt's bound less the time its answer needs to arrive."""
    return f"{max(bound - min(1.0, bound / 10), 0.001):.3f}"


def _final(response: httpx.Response) -> bool:
    """True if this answer ends the call (success, or an error raised here); False to retry."""
    if response.status_code in RETRYABLE_STATUSES:
        return False
    raise_for_answer(response)
    return True


def _too_large(exc: RewardRequestError) -> bool:
    """A whole batch refused for its size: the server's body_too_large / request_too_large, or a
    proxy's own 413 (nginx's client_max_body_size answers HTML)."""
    return exc.status == 413


def absurd_limits(limits: ServerLimits) -> str | None:
    """Why limits a server advertised cannot be meant (a body of a few bytes, no items, no time),
    or None when they can: followed, nonsense like 0 or 1 byte would make every episode its own
    request."""
    if min(limits.max_json_body_bytes, limits.max_raw_body_bytes) < MIN_BODY_BYTES:
        return f"a body of at most {min(limits.max_json_body_bytes, limits.max_raw_body_bytes)} bytes"
    if limits.max_batch_items < 1:
        return f"{limits.max_batch_items} episodes per request"
    if not (math.isfinite(limits.request_timeout_s) and limits.request_timeout_s > 0):
        return f"a request timeout of {limits.request_timeout_s} s"
    return None


class ClientCore:
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
        self.protocol_errors = 0  # answers that could not be right (check_batch, too large), each retried
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

    def _count(self, counter: str, n: int = 1) -> None:
        with self._count_lock:
            setattr(self, counter, getattr(self, counter) + n)

    def _endpoint(self) -> str:
        return self.base_urls[next(self._turn) % len(self.base_urls)]

    def _timeout(self, bound: float | None = None) -> httpx.Timeout:
        total = bound if bound is not None else self.policy.timeout_s
        connect = self.policy.connect_timeout_s if total is None else min(total, self.policy.connect_timeout_s)
        return httpx.Timeout(total, connect=connect)

    def _exchange(self, method: str, url: str, bound: float, cap: int, body: Body | None = None) -> Exchange:
        headers = {DEADLINE_HEADER: _server_deadline(bound)} if body is not None else {}
        return Exchange(method, url, bound, cap, self.policy.connect_timeout_s, body, headers)

    # --- limits ---------------------------------------------------------------------------------

    def _plan(self, items: Items, split: bool) -> list[Part]:
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
            runs += pack(items.sizes, lo, min(lo + size, count), items.overhead, max_bytes, max_items)
        self._count("split_requests", max(0, len(runs) - shares))
        return [part(items, lo, hi) for lo, hi in runs]

    def _ask_limits(self) -> str | None:
        """The URL to ask /health once for the limits before a first batch, when unknown (a
        server that does not say them, or cannot answer now, is asked no more: a body it finds
        too large is halved instead)."""
        if self.limits is not None or self._limits_asked:
            return None
        self._limits_asked = True
        return self.base_urls[0]

    def _learned(self, health: HealthResponse) -> HealthResponse:
        if health.limits is None:
            return health
        why = absurd_limits(health.limits)
        if why is None:
            self.limits = health.limits
        else:  # not followed; a batch the server refuses as too large is halved instead
            logger.warning(
                "reward server at %s advertises limits that cannot be meant (%s: %s); ignoring them",
                self.base_url,
                why,
                health.limits.model_dump(),
            )
        return health

    def _ready(self, health: HealthResponse) -> bool:
        """True when the server serves; a server that reports `failed` will not recover by waiting."""
        if health.status == "failed" and len(self.base_urls) == 1:
            raise RewardUnavailable(f"reward server at {self.base_url} failed: {health.detail}")
        return health.status == "ok"

    def _not_ready(self, timeout_s: float, last: str) -> RewardUnavailable:
        return RewardUnavailable(f"reward server at {self.base_url} not ready after {timeout_s:g} s (last: {last})")

    def _protocol_error(self, exc: RewardProtocolError, path: str) -> str:
        self._count("protocol_errors")
        logger.warning("reward server answered %s with an impossible answer (%s); retrying", path, exc)
        return f"protocol error: {exc}"

    def _own_body_timeout(self, exc: RewardRequestError, bound: float) -> bool:
        """A 408 `body_timeout` that the attempt's own bound caused (the client told the server a
        deadline shorter than the server's own): the request is fine, its time was short, so it
        is retried within the call's deadline rather than read as a refusal."""
        if exc.status != 408 or exc.error_type != "body_timeout":
            return False
        return self.limits is None or bound < self.limits.request_timeout_s

    # --- calls (generators: reward_client.transport performs what they yield) -------------------

    def _request(
        self, path: str, body: Body, read: Callable[[httpx.Response], T], cap: int, deadline: float | None = None
    ) -> Call[T]:
        """One request, attempted until it is answered, refused, or the deadline passes."""
        attempts = _Attempts(self, path, deadline)
        while True:
            bound = attempts.bound()
            self._count("attempts")
            url = self._endpoint() + path
            try:
                response = yield self._exchange("POST", url, bound, cap, body)
                if _final(response):
                    return read(response)
                pause = attempts.failed(_retry_after(response), f"HTTP {response.status_code}")
            except httpx.TransportError as exc:
                pause = attempts.failed(None, f"{type(exc).__name__}: {exc}")
            except RewardProtocolError as exc:
                pause = attempts.failed(None, self._protocol_error(exc, path))
            except RewardRequestError as exc:
                if not self._own_body_timeout(exc, bound):
                    raise
                pause = attempts.failed(None, f"HTTP 408 body_timeout: the body did not arrive within {bound:.3g} s")
            yield Sleep(pause)

    def _score(self, request: ScoreRequest) -> Call[ScoreResponse]:
        body = Body.json(request.model_dump(mode="json", exclude_none=True))
        cap = batch_answer_bytes([item_answer_bytes(request)])
        return (yield from self._request("/score", body, score_reader(request.progress_points), cap))

    def _batch(self, whole: Part, items: Items, deadline: float) -> Call[list[BatchItem]]:
        """One request's items (indices of the call); a body the server finds too large is halved."""
        count, cap = whole.hi - whole.lo, items.answer_cap(whole.lo, whole.hi)
        try:
            reader = batch_reader(items.points[whole.lo : whole.hi])
            answer = yield from self._request("/score/batch", whole.body, reader, cap, deadline)
        except RewardRequestError as exc:
            if not (_too_large(exc) and count > 1):
                raise
            logger.warning("reward server refused %d items as too large (%s); sending halves", count, exc)
            self._count("split_requests")
            answers = yield Together(tuple(self._batch(h, items, deadline) for h in halves(whole, items)), 2)
            return [item for half in answers for item in half]
        return [item.model_copy(update={"index": item.index + whole.lo}) for item in answer]

    def _send(self, items: Items, split: bool, deadline: float) -> Call[list[BatchItem]]:
        calls = tuple(self._batch(p, items, deadline) for p in self._plan(items, split))
        answers = yield Together(calls, PARTS_IN_FLIGHT)
        return [item for answer in answers for item in answer]

    def _split(self, items: Sequence, split: bool, kind: type[JsonItems] | type[RawItems]) -> Call[list[BatchItem]]:
        if not items:
            return []
        calls = _ItemRetries(self, len(items))
        yield from self._probe_limits(calls.attempts.deadline)
        while True:
            try:
                pending = kind([items[i] for i in calls.pending])
                answer = yield from self._send(pending, split, calls.attempts.deadline)
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
            yield Sleep(pause)

    def _score_batch(self, requests: Sequence[ScoreRequest], split: bool) -> Call[list[BatchItem]]:
        return self._split(requests, split, JsonItems)

    def _score_episodes(self, episodes: Sequence[Episode], split: bool) -> Call[list[BatchItem]]:
        return self._split(episodes, split, RawItems)

    def _probe_limits(self, deadline: float) -> Call[None]:
        """Ask /health for the limits before a first batch, within the call's deadline: at most
        half of what is left of it (the batch keeps the rest), HEALTH_TIMEOUT_S or timeout_s."""
        url = self._ask_limits()
        if url is None:
            return
        bound = min(HEALTH_TIMEOUT_S, self.policy.timeout_s or math.inf, (deadline - time.monotonic()) / 2)
        try:
            yield from self._health(url, bound)
        except RewardProtocolError as exc:
            self._count("protocol_errors")
            logger.warning("reward server limits unknown (%s): a batch it refuses as too large is halved", exc)
        except (httpx.HTTPError, RewardClientError) as exc:
            logger.info("reward server limits unknown (%s): a batch it refuses as too large is halved", exc)

    def _health(self, url: str | None, bound: float) -> Call[HealthResponse]:
        """GET /health once, the whole exchange within `bound` seconds."""
        if bound <= 0:
            raise httpx.TimeoutException("no time left for /health")
        response = yield self._exchange("GET", (url or self._endpoint()) + "/health", bound, HEALTH_ANSWER_BYTES)
        return self._learned(parse_answer(HealthResponse, response))

    def _wait_until_ready(self, timeout_s: float, poll_s: float) -> Call[HealthResponse]:
        """Poll /health (each server in turn) until one says ok, every probe and pause within timeout_s."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while (left := deadline - time.monotonic()) > 0:
            try:
                health = yield from self._health(None, min(HEALTH_TIMEOUT_S, left))
                if self._ready(health):
                    return health
                last = health.status
            except (httpx.TransportError, RewardServerError) as exc:
                last = type(exc).__name__
            left = deadline - time.monotonic()
            if left > 0:
                yield Sleep(min(poll_s, left))
        raise self._not_ready(timeout_s, last)


class _Attempts:
    """Counts failed attempts of one call and says how long to wait before the next one."""

    def __init__(self, client: ClientCore, path: str, deadline: float | None = None):
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


class _ItemRetries:
    """One batch call: which episodes still need an answer, and the answers so far.

    Items that failed retryably are sent again (alone) until they succeed, fail for good, or the
    call's deadline passes; then the last error stays in the episode's place."""

    def __init__(self, client: ClientCore, count: int):
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
