"""HTTP clients for the reward server: pooled connections, retries with backoff, a deadline.

Retried: connection errors (refused, reset, cut before the answer), timeouts, and 429 / 502 /
503 / 504 (honouring Retry-After), with jittered exponential backoff, until the overall deadline.
In a batch, items whose error says `retryable` (the engine failed that request, its deadline
passed, the server was full) are sent again, alone, under the same backoff and the same deadline;
the answer keeps one entry per episode, in order. Never retried: other 4xx (the request itself is
wrong; sending it again cannot help), 500, and items whose error is not retryable. A 408
`body_timeout` after a bound the client set itself (its attempt's time, told the server in
X-Reward-Deadline-S) is retried: the request was fine, its time was short.

Every answer is checked before it is believed (`check_batch`): one item per episode, indices
exactly 0..n-1, each item a response or an error, scores and curve points finite in [0, 1].
Anything else (a faulty server or proxy) is a protocol error: counted (`stats()`), retried within
the deadline like a lost connection, never a reward. So is an answer larger than its request can
need (reward_client.bounded_answers): it is read no further than that, gzip included.

Time: a call never outlives `deadline_s`, its /health limits probe and every pause included, and
`wait_until_ready(timeout_s)` never outlives timeout_s. Each attempt has one bound on the whole
exchange (sending the body, waiting, reading the answer), the smaller of `timeout_s` and what is
left of the deadline, enforced on every socket read and write (not httpx's per-read timeout,
which a slowly dripped answer renews forever). The server is told the bound (header
`X-Reward-Deadline-S`, a little less, so its answer still arrives): it ends the request there
with what is done, the rest as retryable item errors, instead of working on for a client that
has left.

Size: a batch is cut into requests the server accepts: at most its advertised item count and
body bytes per transport (`HealthResponse.limits`, learned from /health; limits that cannot be
meant, like a body of 1 byte, are ignored with a warning), at most 16 requests of a call at once,
and a batch still refused as too large (413, from the server or a proxy) is halved and sent
again, so no batch size is refused.

The logic lives once, in reward_client.calls; RewardClient and AsyncRewardClient perform it
(reward_client.transport).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from reward_client.answers import check_batch, check_response
from reward_client.bodies import Body as _Body
from reward_client.bodies import Episode
from reward_client.bodies import json_batch as _json_batch
from reward_client.bodies import raw_batch_body as _raw_batch
from reward_client.bounded_answers import ACCEPT_ENCODING
from reward_client.calls import HEALTH_TIMEOUT_S, ClientCore, RetryPolicy, _Attempts, _ItemRetries
from reward_client.errors import (
    RewardClientError,
    RewardProtocolError,
    RewardRequestError,
    RewardServerError,
    RewardUnavailable,
)
from reward_client.transport import AsyncTransport, SyncTransport, bounded_transport
from reward_protocol.score import RETRYABLE_STATUSES, BatchItem, HealthResponse, ScoreRequest, ScoreResponse

RETRY_STATUS = RETRYABLE_STATUSES

# re-exported: callers import these from here
__all__ = [
    "HEALTH_TIMEOUT_S",
    "AsyncRewardClient",
    "Episode",
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
_PRIVATE_REEXPORTS = (_Attempts, _Body, _ItemRetries, _json_batch, _raw_batch)  # used by tests and scripts


class RewardClient(ClientCore):
    """Blocking client; one instance per process (it pools connections)."""

    def __init__(self, base_url: str | Sequence[str], policy: RetryPolicy | None = None, api_key: str | None = None):
        super().__init__(base_url, policy, api_key)
        headers = {**self.headers, "accept-encoding": ACCEPT_ENCODING}
        self._http = httpx.Client(timeout=self._timeout(), headers=headers, transport=bounded_transport())
        self._run = SyncTransport(self._http).run

    def score(self, request: ScoreRequest) -> ScoreResponse:
        return self._run(self._score(request))

    def score_batch(self, requests: Sequence[ScoreRequest], split: bool = True) -> list[BatchItem]:
        """Score many episodes (JSON bodies); with several servers the batch is split across them."""
        return self._run(self._score_batch(requests, split))

    def score_episodes(self, episodes: Sequence[Episode], split: bool = True) -> list[BatchItem]:
        """Score many episodes given as (options, frames or server-side video path), in one raw
        batch body per server: frames travel as bytes straight from their arrays (the fastest
        way to send an episode; see reward_protocol/raw_batch.py)."""
        return self._run(self._score_episodes(episodes, split))

    def health(self, url: str | None = None) -> HealthResponse:
        """GET /health once, the whole exchange within HEALTH_TIMEOUT_S."""
        return self._run(self._health(url, HEALTH_TIMEOUT_S))

    def wait_until_ready(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> HealthResponse:
        """Poll /health (each server in turn) until one says ok; raise RewardUnavailable after timeout_s."""
        return self._run(self._wait_until_ready(timeout_s, poll_s))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRewardClient(ClientCore):
    """asyncio client with the same behaviour as RewardClient (the same calls, performed as tasks)."""

    def __init__(self, base_url: str | Sequence[str], policy: RetryPolicy | None = None, api_key: str | None = None):
        super().__init__(base_url, policy, api_key)
        headers = {**self.headers, "accept-encoding": ACCEPT_ENCODING}
        self._http = httpx.AsyncClient(timeout=self._timeout(), headers=headers)
        self._run = AsyncTransport(self._http).run

    async def score(self, request: ScoreRequest) -> ScoreResponse:
        return await self._run(self._score(request))

    async def score_batch(self, requests: Sequence[ScoreRequest], split: bool = True) -> list[BatchItem]:
        return await self._run(self._score_batch(requests, split))

    async def score_episodes(self, episodes: Sequence[Episode], split: bool = True) -> list[BatchItem]:
        """(options, frames or server-side video path) pairs in raw batch bodies (see RewardClient)."""
        return await self._run(self._score_episodes(episodes, split))

    async def health(self, url: str | None = None) -> HealthResponse:
        return await self._run(self._health(url, HEALTH_TIMEOUT_S))

    async def wait_until_ready(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> HealthResponse:
        return await self._run(self._wait_until_ready(timeout_s, poll_s))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
