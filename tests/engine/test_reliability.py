"""Lifecycle and faults with the real engines (vLLM, transformers) on the tiny checkpoint, each
server a child process: SIGTERM drains and exits, the client rides out a restart, and work nobody
waits for stops inside the engine. (A dead engine reported and ending the process:
test_engine_faults.py, after its SIGKILL mid-batch.)
(Admission, bad input and error mapping are covered on the fast tier: tests/fast/test_server.py,
test_bad_input.py, test_hostile_input.py.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.score import ScoreRequest
from reward_tools.launch import ServerProcess, free_port
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import (
    CPU_PRESET,
    LONG_FLAGS,
    LONG_TOKENS,
    STEP_FLOOR_FLAGS,
    first_token_seen,
    send_without_waiting,
    stats,
    wait_until,
)

TASK = "put the black bowl on the plate"


def frames_body(**extra) -> dict:
    return {"task_text": TASK, "frames": inline(episode_frames(8)), **extra}


def long_body(tokens: int) -> dict:
    return frames_body(backend_kwargs={"max_tokens": tokens, "ignore_eos": True})


def _server(tmp_path, *flags, port=None) -> ServerProcess:
    server = ServerProcess(
        ["--config", str(CPU_PRESET), *flags], port=port, log_path=tmp_path / f"server-{time.time_ns()}.log"
    )
    server.start()
    try:
        server.wait_ready(300)
    except BaseException:
        server.stop()
        raise
    return server


def test_sigterm_drains_in_flight_work_then_exits_zero(tmp_path, tiny_checkpoint):
    flags = (
        "--engine",
        "hf",
        "--model-path",
        tiny_checkpoint,
        "--shutdown-timeout-s",
        "240",  # transformers on a busy 2-core machine: ~15 tokens/s, so 1000 tokens can take ~70 s
        "--max-tokens-limit",
        "2000",
        *STEP_FLOOR_FLAGS,  # 1000 tokens: at least 10 s, so the drain begins while it runs
    )
    server = _server(tmp_path, *flags)
    try:
        holder = {}
        body = long_body(1000)
        thread = threading.Thread(
            target=lambda: holder.update(r=httpx.post(f"{server.url}/score", json=body, timeout=400))
        )
        thread.start()
        assert first_token_seen(server.url, 0)  # the engine is generating it
        os.killpg(server.proc.pid, signal.SIGTERM)
        assert wait_until(lambda: httpx.get(f"{server.url}/health").json()["status"] == "draining", 30)
        refused = httpx.post(f"{server.url}/score", json=frames_body(), timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "not_ready"
        thread.join(400)
        assert holder["r"].status_code == 200 and holder["r"].json()["output_tokens"] == 1000
        assert server.proc.wait(60) == 0
    finally:
        server.stop()


def test_sigterm_ends_the_process_within_the_shutdown_timeout(tmp_path, tiny_checkpoint):
    flags = (
        "--engine",
        "hf",
        "--model-path",
        tiny_checkpoint,
        "--shutdown-timeout-s",
        "2",
        *LONG_FLAGS,
    )
    server = _server(tmp_path, *flags)
    try:
        thread = threading.Thread(
            target=lambda: httpx.post(f"{server.url}/score", json=long_body(LONG_TOKENS), timeout=300), daemon=True
        )
        thread.start()
        assert first_token_seen(server.url, 0)
        started = time.monotonic()
        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(60)
        # the timeout plus the exit grace, not the generation's 40 s or more (its step floor)
        assert time.monotonic() - started < 2 + 20
    finally:
        server.stop()


def _leave_while_running(url: str) -> None:
    """Send a long generation and close the connection once the engine reports its first token:
    the step floor keeps it generating for 40 s or more after that, however busy the machine."""
    before = stats(url)["first_tokens"]
    sock = send_without_waiting(url, "/score", long_body(LONG_TOKENS))
    try:
        assert first_token_seen(url, before), stats(url)
    finally:
        sock.close()


@pytest.mark.parametrize(
    "engine, extra",
    [
        # the default: vLLM's multimodal cache on, items named by per-request ids (the resent
        # episode gets new ones: nothing to drift apart); the session's server has these flags
        ("vllm", None),
        # the cache with content hashes instead: the abort leaves its two halves out of step, the
        # engine core fails the next request with the same frames as retryable, and the server
        # submits it again
        ("vllm", ("--engine-option", "mm_processor_cache_gb=1", "--engine-option", "curve_clip_ids=false")),
        ("hf", None),
    ],
    ids=["vllm", "vllm-mm-cache-content-hashes", "hf"],
)
def test_abandoned_request_stops_consuming_the_engine(request, tmp_path, tiny_checkpoint, engine, extra):
    """A client that leaves mid-generation: its request is aborted inside the real engine, and the
    same episode sent again is answered. Where the flags are a session server's (LONG_FLAGS), that
    server (a vLLM start costs ~60 s on the 2-core machine), so the counts are read as changes."""
    if extra is None:
        server, own = request.getfixturevalue(f"{engine}_server"), False
    else:
        server, own = _server(tmp_path, "--engine", engine, "--model-path", tiny_checkpoint, *LONG_FLAGS, *extra), True
    try:
        before = stats(server.url)
        _leave_while_running(server.url)
        assert wait_until(lambda: stats(server.url)["running"] == 0, 30)
        s = stats(server.url)
        assert s["aborted"] - before["aborted"] == 1 and s["finished"] == before["finished"], (before, s)
        assert s["episodes_in_progress"] == 0 and s["generating"] == 0
        # the engine is free at once for the next request (it would still be generating otherwise)
        r = httpx.post(f"{server.url}/score", json=frames_body(backend_kwargs={"score_mode": "logprob"}), timeout=120)
        assert r.status_code == 200 and r.json()["parse_status"] == "logprob"
    finally:
        if own:
            server.stop()


def test_deadline_aborts_a_long_primo_generation(tmp_path, tiny_checkpoint):
    flags = ("--engine", "vllm", "--backend", "PRIMO-R1", "--model-path", tiny_checkpoint, "--request-timeout-s", "3")
    server = _server(tmp_path, *flags, *LONG_FLAGS, "--max-tokens", str(LONG_TOKENS))
    try:
        r = httpx.post(f"{server.url}/score", json=long_body(LONG_TOKENS), timeout=120)
        assert r.status_code == 504 and r.json()["error"]["type"] == "deadline_exceeded"
        assert wait_until(lambda: stats(server.url)["running"] == 0, 30)
        assert stats(server.url)["aborted"] == 1
    finally:
        server.stop()


def test_client_rides_out_a_server_restart(tmp_path, tiny_checkpoint):
    port = free_port()
    first = _server(tmp_path, "--engine", "hf", "--model-path", tiny_checkpoint, port=port)
    second = None
    try:
        client = RewardClient(f"http://127.0.0.1:{port}", RetryPolicy(deadline_s=300, backoff_max_s=2))
        assert client.score(ScoreRequest.model_validate(frames_body())).nframes == 8
        first.stop()  # killed mid-rollout
        holder = {}
        thread = threading.Thread(
            target=lambda: holder.update(r=client.score(ScoreRequest.model_validate(frames_body())))
        )
        thread.start()
        time.sleep(2)
        assert thread.is_alive()  # retrying while the server is gone
        second = _server(tmp_path, "--engine", "hf", "--model-path", tiny_checkpoint, port=port)
        thread.join(300)
        assert holder["r"].parse_status is not None and holder["r"].nframes == 8
    finally:
        first.stop()
        if second is not None:
            second.stop()
