"""The client never outlives its deadline (fast tier: real sockets, the real httpx clients, the
real app on the fake engine).

- An answer dripped a byte at a time ends at the attempt's bound, not httpx's per-read timeout.
- The server learns the client's bound (X-Reward-Deadline-S) and answers what is done by then,
  so a batch whose slow episode outlasts the attempt keeps its fast one (before: every attempt
  was cut by the client and resent whole, 0 scores).
- Backoff never overflows and never spins on `Retry-After: 0`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardUnavailable
from reward_protocol.score import BackendKwargs, InlineFrames, ScoreOptions, ScoreRequest
from tests.helpers.servers import InProcessServer, stats


def request() -> ScoreRequest:
    return ScoreRequest(
        task_text="open the drawer", nframes=2, frames=InlineFrames.from_array(np.zeros((2, 28, 28, 3), np.uint8))
    )


class DripServer:
    """Reads a request, answers 200 with a 60-byte body, one byte every 0.1 s (6 s in all)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n")
            for _ in range(60):
                if self.stop.wait(0.1):
                    return
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> DripServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


POLICY = RetryPolicy(deadline_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.1)


def test_a_dripped_answer_ends_at_the_deadline():
    with DripServer() as server, RewardClient(server.url, POLICY) as client:
        started = time.monotonic()
        with pytest.raises(RewardUnavailable, match="within 1 s"):
            client.score(request())
        assert time.monotonic() - started < 1.3  # before: 6 s (each byte renewed httpx's read timeout)


def test_a_dripped_answer_ends_at_the_deadline_async():
    async def go():
        client = AsyncRewardClient(server.url, POLICY)
        try:
            await client.score(request())
        finally:
            await client.aclose()

    with DripServer() as server:
        started = time.monotonic()
        with pytest.raises(RewardUnavailable, match="within 1 s"):
            asyncio.run(go())
        assert time.monotonic() - started < 1.3


def test_the_server_answers_what_is_done_by_the_clients_bound():
    """Scaled down: an attempt bound of 1 s (the hook's timeout_s), a fast episode (0.1 s) and a
    slow one (3 s) in one batch. The server ends the request just before the client's bound and
    answers the fast one; the slow one alone is resent until the deadline."""
    with InProcessServer(engine_option=["token_ms=50"]) as server:
        fast = ScoreOptions(task_text="open the drawer", nframes=2, backend_kwargs=BackendKwargs(max_tokens=2))
        slow = ScoreOptions(task_text="open the drawer", nframes=2, backend_kwargs=BackendKwargs(max_tokens=60))
        frames = np.full((2, 28, 28, 3), 100, np.uint8)
        policy = RetryPolicy(deadline_s=3.0, timeout_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.1)
        with RewardClient(server.url, policy) as client:
            started = time.monotonic()
            items = client.score_episodes([(fast, frames), (slow, frames)])
            assert time.monotonic() - started < 3.5
        assert items[0].response is not None and items[0].response.score is not None
        assert items[1].error is not None and items[1].error.type == "deadline_exceeded"
        assert "X-Reward-Deadline-S" in items[1].error.message
        assert stats(server.url)["aborted"] >= 1


def test_a_slow_batch_within_the_deadline_is_answered_in_one_attempt_by_default():
    """The defaults agree: an attempt may use the rest of deadline_s, so a batch that takes longer
    than any fixed per-attempt timeout but less than the deadline is never cut and resent."""
    with InProcessServer(engine_option=["delay_ms=1500"]) as server:
        options = ScoreOptions(task_text="open the drawer", nframes=2)
        frames = np.full((2, 28, 28, 3), 100, np.uint8)
        with RewardClient(server.url, RetryPolicy(deadline_s=5.0)) as client:
            items = client.score_episodes([(options, frames), (options, frames)])
            assert client.attempts == 1
        assert [i.response.score is not None for i in items] == [True, True]
        assert stats(server.url)["aborted"] == 0


def test_backoff_never_overflows():
    policy = RetryPolicy(backoff_initial_s=0.5, backoff_max_s=8)
    assert all(4.0 <= policy.delay(attempt, None) <= 8.0 for attempt in (10, 1023, 1024, 5000, 10**9))


def test_retry_after_zero_is_not_a_busy_loop():
    count = [0]

    class Busy(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            count[0] += 1
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.send_header("content-length", "0")
            self.end_headers()

    http = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=http.serve_forever, args=(0.02,), daemon=True).start()
    try:
        client = RewardClient(f"http://127.0.0.1:{http.server_address[1]}", RetryPolicy(deadline_s=1.0))
        with pytest.raises(RewardUnavailable, match="HTTP 503"):
            client.score(request())
        assert count[0] <= 3  # before: ~640 requests a second
    finally:
        http.shutdown()
        http.server_close()
