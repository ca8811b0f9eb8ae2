"""The client believes no answer that cannot be right (fast tier).

A small real HTTP server on 127.0.0.1 plays a faulty reward server or proxy: its first answers
are impossible (scores 7.5, -3.0, NaN; indices 100.. for 3 episodes, all 0; an item with neither
a response nor an error; too few items; a curve point above 1), then it answers correctly. The
real httpx clients (sync and async, JSON and raw batches) and the real RLinf hook go through it.
Each impossible answer must be a counted protocol error that is retried, never a reward."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardUnavailable
from reward_client.rlinf.hook import RewardModelConfig, VLMRewardHook
from reward_protocol import raw_batch
from reward_protocol.score import InlineFrames, ScoreOptions, ScoreRequest

FAST = RetryPolicy(deadline_s=10, backoff_initial_s=0.02, backoff_max_s=0.05)
GOOD = 0.42
N = 3


def response(score, progress=None) -> dict:
    return {
        "score": score,
        "model_output": "",
        "backend": "faulty",
        "parse_status": "ok",
        "score_mode": "unit",
        "nframes": 2,
        "progress": progress,
    }


# fault -> the batch answer's items for n episodes
FAULTS = {
    "score_7.5": lambda n: [{"index": i, "response": response(7.5)} for i in range(n)],
    "score_-3.0": lambda n: [{"index": i, "response": response(-3.0)} for i in range(n)],
    "score_nan": lambda n: [{"index": i, "response": response(float("nan"))} for i in range(n)],
    "indices_100": lambda n: [{"index": 100 + i, "response": response(GOOD)} for i in range(n)],
    "indices_all_0": lambda n: [{"index": 0, "response": response(GOOD)} for _ in range(n)],
    "neither": lambda n: [{"index": i} for i in range(n)],
    "too_few": lambda n: [{"index": i, "response": response(GOOD)} for i in range(n - 1)],
    "curve_point_2": lambda n: [{"index": i, "response": response(GOOD, [0.5, 2.0])} for i in range(n)],
    "not_the_schema": lambda n: [{"index": i, "response": {"score": GOOD}} for i in range(n)],
}


class FaultyServer:
    """Answers /score/batch (JSON or raw) and /score with `fault` for the first `faulty` requests,
    then correctly (every score GOOD); /health says ok."""

    def __init__(self, fault: str, faulty: int, max_items: int | None = None):
        self.fault, self.faulty, self.requests = fault, faulty, 0
        self.max_items = max_items  # larger batches: a proxy's 413 in HTML (nginx's client_max_body_size)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, body: dict) -> None:
                data = json.dumps(body).encode()  # NaN stays NaN, as a faulty server writes it
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer({"status": "ok", "backend": "faulty", "engine": "none", "model": "none"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                owner.requests += 1
                bad = owner.requests <= owner.faulty
                if self.path == "/score":
                    items = FAULTS[owner.fault](1) if bad else [{"response": response(GOOD)}]
                    self._answer(items[0].get("response") or {})
                    return
                if self.headers["content-type"] == raw_batch.CONTENT_TYPE:
                    n = len(raw_batch.decode(body)[0].requests)
                else:
                    n = len(json.loads(body)["requests"])
                if owner.max_items is not None and n > owner.max_items:
                    page = b"<html><body><h1>413 Request Entity Too Large</h1></body></html>"
                    self.send_response(413)
                    self.send_header("content-type", "text/html")
                    self.send_header("content-length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                items = FAULTS[owner.fault](n) if bad else [{"index": i, "response": response(GOOD)} for i in range(n)]
                self._answer({"results": items})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def __enter__(self) -> FaultyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.http.shutdown()
        self.http.server_close()


def frames(level: int = 90) -> np.ndarray:
    return np.full((4, 28, 28, 3), level, np.uint8)


def json_requests() -> list[ScoreRequest]:
    return [
        ScoreRequest(task_text="open the drawer", nframes=4, frames=InlineFrames.from_array(frames())) for _ in range(N)
    ]


def raw_episodes() -> list:
    return [(ScoreOptions(task_text="open the drawer", nframes=4), frames()) for _ in range(N)]


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("transport", ["json", "raw"])
def test_an_impossible_answer_is_a_counted_protocol_error_and_is_retried(fault, transport):
    with FaultyServer(fault, faulty=2) as server, RewardClient(server.url, FAST) as client:
        if transport == "json":
            items = client.score_batch(json_requests())
        else:
            items = client.score_episodes(raw_episodes())
        assert [item.index for item in items] == list(range(N))
        assert [item.response.score for item in items] == [GOOD] * N  # only the correct answer became rewards
        assert client.protocol_errors == 2 and client.attempts == 3
        assert client.stats()["protocol_errors"] == 2


@pytest.mark.parametrize("fault", ["score_nan", "indices_100", "neither"])
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


@pytest.mark.parametrize("fault", ["score_7.5", "score_nan", "curve_point_2"])
def test_a_single_score_is_checked(fault):
    with FaultyServer(fault, faulty=1) as server, RewardClient(server.url, FAST) as client:
        assert client.score(json_requests()[0]).score == GOOD
        assert client.protocol_errors == 1


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
