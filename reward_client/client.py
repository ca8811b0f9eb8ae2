"""HTTP clients for the reward server: pooled connections, retries with backoff, a deadline.

Retried: connection errors, timeouts, and 429 / 502 / 503 / 504 (honouring Retry-After),
with jittered exponential backoff, until the overall deadline. Never retried: other 4xx (the
request itself is wrong; sending it again cannot help) and 500.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from reward_client.protocol import (
    BatchItem,
    BatchScoreRequest,
    BatchScoreResponse,
    ErrorBody,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
)

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 502, 503, 504})


class RewardClientError(RuntimeError):
    """Base class of everything this client raises."""


class RewardRequestError(RewardClientError):
    """The server refused the request as sent (4xx); retrying cannot help."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(f"reward server refused the request ({status} {error_type}): {message}")
        self.status = status
        self.error_type = error_type


class RewardServerError(RewardClientError):
    """The server failed (500) or answered something that is not the documented schema."""


class RewardUnavailable(RewardClientError):
    """No usable answer before the deadline: server down, overloaded, or too slow."""


@dataclass(frozen=True)
class RetryPolicy:
    deadline_s: float = 300.0  # overall, across all attempts
    timeout_s: float = 120.0  # one attempt
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    connect_timeout_s: float = 5.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.backoff_max_s) * (1 + random.uniform(0, 0.25))
        base = min(self.backoff_max_s, self.backoff_initial_s * 2**attempt)
        return random.uniform(base / 2, base)  # jitter spreads out many envs retrying together


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _dumps(body: dict) -> bytes:
    """JSON bytes of a request body; orjson when installed (10x faster on megabytes of frames)."""
    try:
        import orjson

        return orjson.dumps(body)
    except ImportError:
        return json.dumps(body).encode()


JSON_HEADERS = {"content-type": "application/json"}


def _raise_for_answer(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = ErrorBody.model_validate(response.json()).error
        kind, message = error.type, error.message
    except (ValueError, ValidationError):
        kind, message = "unknown", response.text[:300]
    if 400 <= response.status_code < 500:
        raise RewardRequestError(response.status_code, kind, message)
    raise RewardServerError(f"reward server error {response.status_code} {kind}: {message}")


def _parse(model, response: httpx.Response):
    try:
        return model.model_validate(response.json())
    except (ValueError, ValidationError) as exc:
        raise RewardServerError(f"reward server answered an unexpected body: {exc}") from None


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
        self._turn = itertools.count()

    def _endpoint(self) -> str:
        return self.base_urls[next(self._turn) % len(self.base_urls)]

    def _chunks(self, requests: Sequence[ScoreRequest], split: bool) -> list[tuple[int, list[ScoreRequest]]]:
        """(offset, requests) per replica when splitting, else one chunk."""
        parts = min(len(self.base_urls), len(requests)) if split else 1
        size = -(-len(requests) // max(parts, 1))
        return [(i, list(requests[i : i + size])) for i in range(0, len(requests), size)] or [(0, [])]

    def _ready(self, health: HealthResponse) -> bool:
        """True when the server serves; a server that reports `failed` will not recover by waiting."""
        if health.status == "failed" and len(self.base_urls) == 1:
            raise RewardUnavailable(f"reward server at {self.base_url} failed: {health.detail}")
        return health.status == "ok"

    def _not_ready(self, timeout_s: float, last: str) -> RewardUnavailable:
        return RewardUnavailable(f"reward server at {self.base_url} not ready after {timeout_s:g} s (last: {last})")

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.policy.timeout_s, connect=self.policy.connect_timeout_s)


class _Attempts:
    """Counts failed attempts of one call and says how long to wait before the next one."""

    def __init__(self, client: _Base, path: str):
        self.client, self.path = client, path
        self.deadline = time.monotonic() + client.policy.deadline_s
        self.count = 0

    def failed(self, retry_after: float | None, what: str) -> float:
        self.count += 1
        pause = self.client.policy.delay(self.count, retry_after)
        if time.monotonic() + pause >= self.deadline:
            raise RewardUnavailable(
                f"no answer from {self.client.base_url}{self.path} within {self.client.policy.deadline_s:g} s "
                f"({self.count} attempts; last: {what})"
            )
        logger.debug("retrying %s in %.2f s (%s)", self.path, pause, what)
        return pause


def _final(response: httpx.Response) -> bool:
    """True if this answer ends the call (success, or an error raised here); False to retry."""
    if response.status_code in RETRY_STATUS:
        return False
    _raise_for_answer(response)
    return True


class RewardClient(_Base):
    """Blocking client; one instance per process (it pools connections)."""

    def __init__(self, base_url: str, policy: RetryPolicy | None = None, api_key: str | None = None):
        super().__init__(base_url, policy, api_key)
        self._http = httpx.Client(timeout=self._timeout(), headers=self.headers)

    def _request(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        attempts = _Attempts(self, path)
        content = _dumps(body) if body is not None else None  # encoded once, whatever the retries
        while True:
            self.attempts += 1
            try:
                response = self._http.request(method, self._endpoint() + path, content=content, headers=JSON_HEADERS)
                if _final(response):
                    return response
                pause = attempts.failed(_retry_after(response), f"HTTP {response.status_code}")
            except httpx.TransportError as exc:
                pause = attempts.failed(None, f"{type(exc).__name__}: {exc}")
            time.sleep(pause)

    def score(self, request: ScoreRequest) -> ScoreResponse:
        response = self._request("POST", "/score", request.model_dump(mode="json", exclude_none=True))
        return _parse(ScoreResponse, response)

    def _batch(self, offset: int, requests: list[ScoreRequest]) -> list[BatchItem]:
        body = BatchScoreRequest(requests=requests).model_dump(mode="json", exclude_none=True)
        items = _parse(BatchScoreResponse, self._request("POST", "/score/batch", body)).results
        return [item.model_copy(update={"index": item.index + offset}) for item in items]

    def score_batch(self, requests: Sequence[ScoreRequest], split: bool = True) -> list[BatchItem]:
        """Score many episodes; with several servers the batch is split across them (split=True)."""
        chunks = self._chunks(requests, split)
        if len(chunks) == 1:
            return self._batch(*chunks[0])
        with ThreadPoolExecutor(len(chunks)) as pool:
            return [item for part in pool.map(lambda c: self._batch(*c), chunks) for item in part]

    def health(self, url: str | None = None) -> HealthResponse:
        response = self._http.get((url or self._endpoint()) + "/health")
        return _parse(HealthResponse, response)

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

    def __init__(self, base_url: str, policy: RetryPolicy | None = None, api_key: str | None = None):
        super().__init__(base_url, policy, api_key)
        self._http = httpx.AsyncClient(timeout=self._timeout(), headers=self.headers)

    async def _request(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        attempts = _Attempts(self, path)
        content = _dumps(body) if body is not None else None
        while True:
            self.attempts += 1
            try:
                response = await self._http.request(
                    method, self._endpoint() + path, content=content, headers=JSON_HEADERS
                )
                if _final(response):
                    return response
                pause = attempts.failed(_retry_after(response), f"HTTP {response.status_code}")
            except httpx.TransportError as exc:
                pause = attempts.failed(None, f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(pause)

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        response = await self._request("POST", "/score", request.model_dump(mode="json", exclude_none=True))
        return _parse(ScoreResponse, response)

    async def _batch(self, offset: int, requests: list[ScoreRequest]) -> list[BatchItem]:
        body = BatchScoreRequest(requests=requests).model_dump(mode="json", exclude_none=True)
        items = _parse(BatchScoreResponse, await self._request("POST", "/score/batch", body)).results
        return [item.model_copy(update={"index": item.index + offset}) for item in items]

    async def score_batch(self, requests: Sequence[ScoreRequest], split: bool = True) -> list[BatchItem]:
        """Score many episodes; with several servers the batch is split across them (split=True)."""
        parts = await asyncio.gather(*(self._batch(*c) for c in self._chunks(requests, split)))
        return [item for part in parts for item in part]

    async def health(self, url: str | None = None) -> HealthResponse:
        return _parse(HealthResponse, await self._http.get((url or self._endpoint()) + "/health"))

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
