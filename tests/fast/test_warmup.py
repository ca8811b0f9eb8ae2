"""The start-up warm-up: the engine scores a synthetic batch of the configured shapes before
/health says ok, so the first real batch runs at steady speed (reward_server/core/warmup.py)."""

from __future__ import annotations

import time

from tests.helpers.episodes import score_body
from tests.helpers.servers import InProcessServer, get, post, stats


def test_health_is_not_ok_until_the_warmup_batch_has_been_scored():
    server = InProcessServer(
        warmup=True, warmup_batch=3, warmup_frames=6, warmup_size=100, engine_option=["delay_ms=400"]
    )
    engine = server.engine
    server.thread.start()
    try:
        seen = []  # (health status, warm-up requests the engine had received, requests running)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                status = get(f"{server.url}/health", timeout=5).json()["status"]
            except Exception:  # not listening yet
                status = None
            seen.append((status, len(engine.seen), engine.stats.running))
            if status == "ok":
                break
            time.sleep(0.02)
        statuses = [s for s, _, _ in seen]
        assert statuses[-1] == "ok", seen[-5:]
        # while the synthetic batch was in the engine, /health said loading
        assert any(s == "loading" and running == 6 for s, _, running in seen), seen
        # ok only once every warm-up episode was scored: 3 per warmed score mode (auto, logprob)
        assert seen[-1][1] == 6 and engine.stats.running == 0
        assert all(req.request_id.startswith("warmup-") for req in engine.seen)
        modes = sorted(req.sampling.mode for req in engine.seen)
        assert modes == ["generate"] * 3 + ["logprob"] * 3
        # the configured shapes, on the model grid as real frames would be (100 -> 112)
        assert {req.video.shape for req in engine.seen} == {(6, 112, 112, 3)}
        assert all(req.sampling.max_tokens <= 16 for req in engine.seen if req.sampling.mode == "generate")

        s = stats(server.url)
        assert s["warmup"]["episodes"] == 6 and s["warmup"]["score_modes"] == ["auto", "logprob"]
        assert s["warmup"]["frames"] == 6 and s["warmup"]["size"] == 100 and s["warmup"]["seconds"] >= 0.4
        assert s["requests"] == 0 and s["finished"] == 0  # the counters describe real requests only

        r = post(f"{server.url}/score", json=score_body())
        assert r.status_code == 200 and len(engine.seen) == 7 and not engine.seen[-1].request_id.startswith("warmup-")
    finally:
        server.stop()


def test_the_fake_engine_skips_the_warmup_unless_asked():
    with InProcessServer() as server:
        assert stats(server.url)["warmup"] is None and server.engine.seen == []


def test_a_warmup_the_engine_cannot_score_fails_the_server():
    with InProcessServer(warmup=True, warmup_batch=1, engine_option=["fail_on=drawer"]) as server:
        health = get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "warm-up" in health.json()["detail"]
