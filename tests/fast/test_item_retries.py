"""Batch items that failed retryably are sent again (fast tier: the real app on the fake engine
over real HTTP, the real httpx clients and the real RLinf hook).

The fake engine's `refuse_once_on` fails the first request whose prompt holds a word, as vLLM
fails one request of a batch (engine_request_failed, 503 semantics); `refuse_on` fails it every
time; `split_words` makes logprob scoring impossible (a 400 no resend can fix)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient
from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.hook import VLMRewardHook
from reward_protocol.score import BackendKwargs, InlineFrames, ScoreOptions, ScoreRequest
from tests.helpers.servers import InProcessServer, post

FAST = RetryPolicy(deadline_s=30, timeout_s=20, backoff_initial_s=0.05, backoff_max_s=0.2)


@pytest.fixture(scope="module")
def server():
    with InProcessServer(engine_option=["refuse_once_on=FLAKY", "refuse_on=ALWAYS", "split_words=Yes"]) as s:
        yield s


def frames(level: int) -> np.ndarray:
    return np.full((4, 56, 56, 3), level, np.uint8)


def tasks(tag: str) -> list[str]:
    # a new tag per test: refuse_once_on fails each distinct prompt once, the first time it is seen
    return [f"{tag} plain one", f"{tag} FLAKY two", f"{tag} plain three", f"{tag} FLAKY four"]


def json_requests(tag: str) -> list[ScoreRequest]:
    return [
        ScoreRequest(task_text=t, nframes=4, frames=InlineFrames.from_array(frames(40 * (i + 1))))
        for i, t in enumerate(tasks(tag))
    ]


def raw_episodes(tag: str) -> list[tuple[ScoreOptions, np.ndarray]]:
    return [(ScoreOptions(task_text=t, nframes=4), frames(40 * (i + 1))) for i, t in enumerate(tasks(tag))]


EXPECTED = [round(40 * (i + 1) / 255 * 100) / 100 for i in range(4)]  # the fake engine's brightness score


def test_item_errors_say_whether_resending_can_help(server):
    requests = [
        {"task_text": "x ALWAYS", "frames": InlineFrames.from_array(frames(10)).model_dump()},
        {
            "task_text": "x",
            "frames": InlineFrames.from_array(frames(10)).model_dump(),
            "backend_kwargs": {"score_mode": "logprob"},
        },
        {"task_text": "x", "video_path": "/nowhere/at/all.mp4"},
    ]
    items = post(f"{server.url}/score/batch", json={"requests": requests}).json()["results"]
    errors = [(i["error"]["type"], i["error"]["retryable"]) for i in items]
    assert errors[0] == ("engine_request_failed", True)
    assert errors[1] == ("unsupported_option", False)
    assert errors[2][1] is False
    # whole-request errors carry it too: a full server says so
    whole = post(f"{server.url}/score", json=requests[0])
    assert whole.status_code == 503 and whole.json()["error"]["retryable"] is True


@pytest.mark.parametrize("transport", ["json", "raw"])
def test_sync_client_resends_only_the_failed_items(server, transport):
    client = RewardClient(server.url, FAST)
    seen = len(server.engine.seen)
    tag = f"sync-{transport}"
    items = client.score_batch(json_requests(tag)) if transport == "json" else client.score_episodes(raw_episodes(tag))
    assert [i.index for i in items] == [0, 1, 2, 3]
    assert all(i.error is None for i in items), [i.error for i in items]
    assert [i.response.score for i in items] == pytest.approx(EXPECTED)
    assert len(server.engine.seen) - seen == 6  # 4, then the 2 FLAKY items again
    assert client.attempts == 2


@pytest.mark.parametrize("transport", ["json", "raw"])
def test_async_client_resends_only_the_failed_items(server, transport):
    async def go():
        client = AsyncRewardClient(server.url, FAST)
        tag = f"async-{transport}"
        if transport == "json":
            return await client.score_batch(json_requests(tag)), client
        return await client.score_episodes(raw_episodes(tag)), client

    seen = len(server.engine.seen)
    items, client = asyncio.run(go())
    assert [i.response.score for i in items] == pytest.approx(EXPECTED)
    assert len(server.engine.seen) - seen == 6 and client.attempts == 2


def test_a_batch_split_over_replicas_is_resent_in_order(server):
    client = RewardClient([server.url, server.url], FAST)
    items = client.score_batch(json_requests("replicas"))
    assert [i.index for i in items] == [0, 1, 2, 3]
    assert [i.response.score for i in items] == pytest.approx(EXPECTED)


def test_an_item_that_keeps_failing_ends_at_the_deadline_with_its_error(server):
    client = RewardClient(server.url, RetryPolicy(deadline_s=1.5, backoff_initial_s=0.1, backoff_max_s=0.2))
    requests = json_requests("deadline")
    requests[2] = requests[2].model_copy(update={"task_text": "deadline ALWAYS three"})
    items = client.score_batch(requests)
    assert [i.error is None for i in items] == [True, True, False, True]
    assert items[2].error.type == "engine_request_failed" and items[2].error.retryable
    assert client.attempts >= 3


def test_errors_resending_cannot_fix_are_not_resent(server):
    client = RewardClient(server.url, FAST)
    requests = json_requests("final")
    requests[0] = requests[0].model_copy(update={"backend_kwargs": BackendKwargs(score_mode="logprob")})
    items = client.score_batch(requests)
    assert items[0].error.type == "unsupported_option" and not items[0].error.retryable
    assert all(i.error is None for i in items[1:])
    assert client.attempts == 2  # the FLAKY ones once more; the refused one never


def test_the_hook_sees_scores_when_an_item_fails_once(server):
    """Under the hook's defaults (fail_on_request_error: True), a fault resending fixes raises nothing."""
    n = 4
    config = RewardModelConfig(enable=True, url=server.url, nframes=4, wait_ready_s=30)
    hook = VLMRewardHook(config, num_envs=n)
    hook.client = RewardClient(server.url, FAST)  # the hook's own policy, with short pauses
    frame = lambda t: np.full((n, 56, 56, 3), 20 * t, np.uint8)  # noqa: E731
    hook.on_reset(None, frame(0))
    texts = ["hook FLAKY task", "hook task", "hook FLAKY other", "hook other"]
    for t in range(1, 6):
        values = hook.on_step(frame(t), texts, np.zeros(n, bool), np.full(n, t == 5))
    assert values.tolist() == pytest.approx([round(100 / 255 * 100) / 100] * n)
    assert hook.counts["fallbacks"] == 0 and hook.counts["request_errors"] == 0
