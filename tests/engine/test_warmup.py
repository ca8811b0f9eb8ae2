"""The start-up warm-up on a real engine: scored before /health says ok (reward_server/core/warmup.py)."""

from __future__ import annotations

from reward_server.settings import load_yaml
from tests.helpers.servers import CPU_PRESET, stats


def test_real_engine_warms_up_before_it_reports_ok(vllm_server):
    """The session's vLLM server (tiny checkpoint, cpu_tiny preset) warmed up at start."""
    log = vllm_server.log_path.read_text(errors="replace")
    warm, ready = log.find("warm-up: "), log.find("ready: backend=")
    assert 0 <= warm < ready, log[-3000:]
    assert vllm_server.health_seen[0] == "loading"
    preset = load_yaml(CPU_PRESET)
    report = stats(vllm_server.url)["warmup"]
    assert report["score_modes"] == ["auto", "logprob"] and report["episodes"] == 2 * preset["warmup_batch"]
    assert (report["frames"], report["size"]) == (preset["warmup_frames"], preset["warmup_size"])
