"""The env-side client against real servers: retries through startup, no retry on 4xx, deadlines."""

from __future__ import annotations

import time

import pytest

from reward_client.client import RetryPolicy, RewardClient, RewardUnavailable
from reward_protocol.score import InlineFrames, ScoreRequest
from reward_tools.launch import free_port
from tests.helpers.episodes import episode_frames

TASK = "open the top drawer and put the bowl inside"


def request(**kw) -> ScoreRequest:
    return ScoreRequest(task_text=TASK, frames=InlineFrames.from_array(episode_frames(12)), **kw)


def test_retry_policy_honours_retry_after_and_backs_off_with_jitter():
    policy = RetryPolicy(backoff_initial_s=0.5, backoff_max_s=8)
    assert all(3.0 <= policy.delay(1, retry_after=3.0) <= 3.75 for _ in range(50))
    assert all(8.0 <= policy.delay(1, retry_after=60.0) <= 10.0 for _ in range(50))  # capped
    first = [policy.delay(1, None) for _ in range(200)]
    fourth = [policy.delay(4, None) for _ in range(200)]
    assert 0.5 <= min(first) and max(first) <= 1.0
    assert 4.0 <= min(fourth) and max(fourth) <= 8.0
    assert len(set(first)) > 100  # jittered: envs retrying together spread out


def test_unreachable_server_ends_at_the_deadline():
    client = RewardClient(f"http://127.0.0.1:{free_port()}", RetryPolicy(deadline_s=1.5, backoff_initial_s=0.1))
    started = time.monotonic()
    with pytest.raises(RewardUnavailable, match=r"within 1\.5 s"):
        client.score(request())
    assert time.monotonic() - started < 3.0
    assert client.attempts >= 3
