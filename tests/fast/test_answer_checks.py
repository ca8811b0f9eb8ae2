"""The client believes no answer that cannot be right (fast tier).

A small real HTTP server on 127.0.0.1 plays a faulty reward server or proxy: its first answers
are impossible (scores 7.5, -3.0, NaN; indices 100.. for 3 episodes, all 0; an item with neither
a response nor an error; too few items; a curve point above 1), then it answers correctly. The
real httpx clients (sync and async, JSON and raw batches) and the real RLinf hook go through it.
Each impossible answer must be a counted protocol error that is retried, never a reward."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardUnavailable
from reward_client.rlinf.hook import RewardModelConfig, VLMRewardHook
from reward_protocol.score import InlineFrames, ScoreOptions, ScoreRequest
from tests.helpers.faulty import CURVE_FAULTS, FAULTS, GOOD, FaultyServer, curve

FAST = RetryPolicy(deadline_s=10, backoff_initial_s=0.02, backoff_max_s=0.05)
N = 3


def frames(level: int = 90) -> np.ndarray:
    return np.full((4, 28, 28, 3), level, np.uint8)


def options(points: int = 1) -> ScoreOptions:
    return ScoreOptions(task_text="open the drawer", nframes=4, progress_points=points)


def json_requests(points: int = 1) -> list[ScoreRequest]:
    return [ScoreRequest(**options(points).model_dump(), frames=InlineFrames.from_array(frames())) for _ in range(N)]


def raw_episodes(points: int = 1) -> list:
    return [(options(points), frames()) for _ in range(N)]


def protocol_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "impossible answer" in r.getMessage()]


def score_through(server: FaultyServer, transport: str, points: int = 1):
    with RewardClient(server.url, FAST) as client:
        if transport == "json":
            items = client.score_batch(json_requests(points))
        elif transport == "raw":
            items = client.score_episodes(raw_episodes(points))
        else:  # /score, one episode
            return [client.score(json_requests(points)[0])], client
        assert [item.index for item in items] == list(range(N))
        return [item.response for item in items], client


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("transport", ["json", "raw"])
def test_an_impossible_answer_is_a_counted_protocol_error_and_is_retried(fault, transport, caplog):
    """Scores out of range, wrong indices, and answers only a lax reading makes right (`true` or
    `"0.7"` as a score, `[false, true]` as a curve, `"1"`, `true` or `1.0` as an index), and parts
    that disagree (a failed parse with a score, a score that is not the curve's last point): each
    a protocol error naming what is wrong, retried; only the right answer becomes a score."""
    caplog.set_level(logging.WARNING, "reward_client.client")
    with FaultyServer(fault, faulty=2) as server:
        responses, client = score_through(server, transport)
    assert [r.score for r in responses] == [GOOD] * N  # only the correct answer became rewards
    assert client.protocol_errors == 2 and client.attempts == 3
    assert client.stats()["protocol_errors"] == 2
    warnings = protocol_warnings(caplog)
    assert len(warnings) == 2 and all(FAULTS[fault][1] in w for w in warnings), warnings


@pytest.mark.parametrize("fault", sorted(CURVE_FAULTS))
@pytest.mark.parametrize("transport", ["json", "raw", "score"])
def test_a_curve_must_have_exactly_the_points_asked_for(fault, transport, caplog):
    """Asked for K = 4: 2 points, 20 points or none at all are protocol errors (before: 2 points
    were placed at the wrong steps, 20 raised ProgressPointsError, none made the run sparse)."""
    caplog.set_level(logging.WARNING, "reward_client.client")
    with FaultyServer(fault, faulty=1) as server:
        responses, client = score_through(server, transport, points=4)
    assert [r.progress for r in responses] == [curve(4)] * len(responses)
    assert [r.score for r in responses] == [GOOD] * len(responses)
    assert client.protocol_errors == 1
    assert CURVE_FAULTS[fault][1] in protocol_warnings(caplog)[0]


def test_a_curve_on_a_one_score_request_is_refused():
    """progress_points 1 asks for one score: an answer with a 2-point curve is not for this request."""
    with FaultyServer("curve_2_points", faulty=1) as server:
        responses, client = score_through(server, "raw", points=1)
    assert [r.progress for r in responses] == [None] * N and client.protocol_errors == 1


@pytest.mark.parametrize("fault", ["score_nan", "indices_100", "neither", "score_true", "index_float"])
def test_the_async_client_checks_its_answers_too(fault):
    async def go():
        client = AsyncRewardClient(server.url, FAST)
        try:
            return await client.score_batch(json_requests()), await client.score_episodes(raw_episodes()), client
        finally:
            await client.aclose()

    with FaultyServer(fault, faulty=1) as server:
        as_json, as_raw, client = asyncio.run(go())
    assert [i.response.score for i in as_json + as_raw] == [GOOD] * 2 * N
    assert client.protocol_errors == 1


def test_the_async_client_checks_the_curve_length():
    async def go():
        client = AsyncRewardClient(server.url, FAST)
        try:
            return await client.score_episodes(raw_episodes(4)), await client.score(json_requests(4)[0]), client
        finally:
            await client.aclose()

    with FaultyServer("curve_20_points", faulty=2) as server:
        items, single, client = asyncio.run(go())
    assert [i.response.progress for i in items] == [curve(4)] * N and single.progress == curve(4)
    assert client.protocol_errors == 2


@pytest.mark.parametrize(
    "fault", ["score_7.5", "score_nan", "curve_point_2", "score_true", "score_string", "no_number_with_score"]
)
def test_a_single_score_is_checked(fault):
    with FaultyServer(fault, faulty=1) as server:
        responses, client = score_through(server, "score")
    assert responses[0].score == GOOD and client.protocol_errors == 1


def test_a_server_that_keeps_answering_wrongly_is_unavailable_at_the_deadline():
    policy = RetryPolicy(deadline_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.1)
    with FaultyServer("indices_all_0", faulty=10**6) as server, RewardClient(server.url, policy) as client:
        started = time.monotonic()
        with pytest.raises(RewardUnavailable, match="protocol error: the answer's indices are"):
            client.score_batch(json_requests())
        assert time.monotonic() - started < 1.5
        # every answer was wrong; only the last attempt may have been cut by the deadline instead
        assert client.protocol_errors >= 3 and client.attempts - client.protocol_errors in (0, 1)


@pytest.mark.parametrize("fault", ["neither", "score_-3.0"])
def test_the_hook_falls_back_and_counts_instead_of_crashing(fault):
    """`fail_on_request_error: False`: an impossible answer is a counted fallback (before: an item
    with neither field raised AttributeError in the hook, and -3.0 became the reward)."""
    with FaultyServer(fault, faulty=10**6) as server:
        config = RewardModelConfig(
            enable=True, url=server.url, nframes=4, wait_ready_s=5, deadline_s=1.0, fail_on_request_error=False
        )
        client = RewardClient(server.url, RetryPolicy(deadline_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.1))
        h = VLMRewardHook(config, num_envs=N, client=client)
        h.on_reset(None, np.full((N, 28, 28, 3), 50, np.uint8))
        for t in range(1, 4):
            values = h.on_step(
                np.full((N, 28, 28, 3), 50 + t, np.uint8),
                ["open the drawer"] * N,
                np.zeros(N, bool),
                np.full(N, t == 3),
            )
        assert values.tolist() == [0.0] * N  # the 'zero' fallback, not -3.0
        assert h.counts["fallbacks"] == N and h.counts["request_errors"] == 1 and h.counts["scored"] == 0
        info = h.episode_info()
        assert info["vlm_fallback"].tolist() == [1.0] * N
        assert info["vlm_protocol_errors"][0] == client.protocol_errors >= 3


def test_a_proxys_413_halves_the_batch_until_it_passes():
    with FaultyServer("score_7.5", faulty=0, max_items=1) as server, RewardClient(server.url, FAST) as client:
        items = client.score_episodes(raw_episodes())
        assert [item.response.score for item in items] == [GOOD] * N
        assert client.split_requests == 2  # 3 -> 1 + 2 -> 1 + 1 + 1


def test_the_error_at_the_deadline_names_why_the_attempts_before_a_cut_short_one_failed():
    """The deadline can cut the last attempt short (a timeout): the error still says what the
    attempts before it got, here answers that could not be right."""
    from reward_client.client import _Attempts

    with RewardClient("http://127.0.0.1:9", RetryPolicy(deadline_s=60.0)) as client:
        attempts = _Attempts(client, "/score/batch")
        for _ in range(3):
            attempts.failed(None, "protocol error: the answer's indices are [0, 0]")
        attempts.failed(None, "ReadTimeout: the attempt's time bound passed")
        message = str(attempts._unavailable())
    assert "4 attempts; last: ReadTimeout" in message
    assert "before it: protocol error: the answer's indices are [0, 0]" in message
