"""Progress curves (`progress_points`) on the fake engine: the contract, the prefix layout the
profiles build, bounds and their 422s on every route (JSON, batch, raw batch), parse failures
per point, and a bounded fuzz of curve requests that must never get a 5xx. The same curves on
vLLM (with its prefix cache) and transformers: tests/engine/test_curves.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from reward_client.client import RewardClient
from reward_protocol import raw_batch
from reward_protocol.progress import ProgressPointsError, check_points, gains, prefix_ends, value_order_correlation
from reward_protocol.score import BackendKwargs, ScoreOptions
from reward_server.engines.io import TextPart, VideoPart
from reward_server.engines.vllm.curves import assign_clip_ids, chain_leaders, item_ids
from reward_server.profiles import load_profile
from tests.helpers.episodes import TASK, inline, ramp
from tests.helpers.servers import InProcessServer, get, post


@pytest.fixture(scope="module")
def server():
    with InProcessServer(max_progress_points=16) as s:
        yield s


def test_prefix_ends_is_one_rule():
    assert prefix_ends(16, 1) == [16]
    assert prefix_ends(16, 4) == [4, 8, 12, 16]
    assert prefix_ends(16, 3) == [6, 11, 16]
    assert prefix_ends(5, 5) == [1, 2, 3, 4, 5]
    for frames in range(1, 40):
        for points in range(1, frames + 1):
            ends = prefix_ends(frames, points)
            assert ends[-1] == frames and all(b > a for a, b in zip([0, *ends], ends, strict=False))
    with pytest.raises(ProgressPointsError, match=r"allowed 1\.\.4"):
        prefix_ends(4, 5)
    with pytest.raises(ProgressPointsError, match="max-progress-points 8"):
        check_points(9, 16, limit=8)
    assert gains([0.2, 0.5, None, 0.4]) == pytest.approx([0.2, 0.3, 0.0, -0.1])
    assert sum(gains([0.1, None, 0.7])) == pytest.approx(0.7)
    assert value_order_correlation([0.1, 0.5, None, 0.9]) == 1.0
    assert value_order_correlation([0.9, 0.5, 0.1]) == -1.0
    assert value_order_correlation([0.2, 0.1, 0.1, 0.3]) == pytest.approx(1.5 / 22.5**0.5)  # ties share a rank
    assert value_order_correlation([0.5, 0.5]) is None and value_order_correlation([None, 0.3]) is None


@pytest.mark.parametrize("backend", ["qwen2_5_vl_vllm", "PRIMO-R1"])
@pytest.mark.parametrize("points", [5, 8, 16])
def test_each_point_is_a_prompt_prefix_of_the_next(backend, points):
    profile = load_profile(backend)
    video = ramp(16)
    ends = prefix_ends(16, points)
    requests = profile.build_curve(TASK, video, BackendKwargs(), "auto", points)
    assert len(requests) == points
    shared = []  # per point: its clips that later points share (all but an odd tail)
    for end, request in zip(ends, requests, strict=True):
        clips = request.videos()
        assert all(len(c) % 2 == 0 for c in clips)  # frames in pairs
        assert [p for p in request.chat.user if isinstance(p, VideoPart)] == [VideoPart()] * len(clips)
        assert isinstance(request.chat.user[-1], TextPart)
        # the clips hold exactly the prefix's frames; a point ending inside a pair has its own tail,
        # that pair's first frame doubled
        held = np.concatenate([*clips[:-1], clips[-1][: 1 if end % 2 else None]])
        np.testing.assert_array_equal(held, video[:end])
        shared.append(clips[:-1] if end % 2 else clips)
        if backend == "PRIMO-R1":
            np.testing.assert_array_equal(request.images[-1], video[end - 1])  # the prefix's own last frame
    for (short, longer_request), ours in zip(itertools.pairwise(requests), shared, strict=False):
        n = len(ours)
        assert all(a is b for a, b in zip(ours, longer_request.videos()[:n], strict=True))  # the same items
        upto = (1 if backend == "PRIMO-R1" else 0) + n  # chat parts before the first unshared item
        assert short.chat.user[:upto] == longer_request.chat.user[:upto]
        assert short.chat.system == longer_request.chat.system
    visual = sum(len(c) for c in requests[-1].videos())
    assert visual == 16  # the longest point shows the episode once: no padding in the shared clips
    one = profile.build_curve(TASK, video, BackendKwargs(), "auto", 1)
    assert len(one) == 1 and not one[0].clips and np.array_equal(one[0].video, video)  # K = 1: today's request


@pytest.mark.parametrize("backend", ["qwen2_5_vl_vllm", "PRIMO-R1"])
@pytest.mark.parametrize(("frames", "points"), [(16, 16), (16, 5), (15, 15), (3, 3), (16, 4)])
def test_shifted_partial_groups_show_each_prefix_from_one_of_two_chains(backend, frames, points):
    """--progress-partial-groups shifted: a point ending inside a frame pair shows its frames
    paired from its end (the first frame doubled in front), one clip per pair, in a chain the
    other such points share; a point ending on a whole pair shows what the tail layout shows.
    Each point's clips are the first ones of its chain's longest point."""
    profile = load_profile(backend, partial_groups="shifted")
    video = ramp(frames)
    ends = prefix_ends(frames, points)
    requests = profile.build_curve(TASK, video, BackendKwargs(), "auto", points)
    tails = load_profile(backend).build_curve(TASK, video, BackendKwargs(), "auto", points)
    for end, request, tail in zip(ends, requests, tails, strict=True):
        clips = request.videos()
        if end % 2 == 0:
            assert [c.tolist() for c in clips] == [c.tolist() for c in tail.videos()]
            continue
        assert len(clips) == -(-end // 2) and all(len(c) == 2 for c in clips)
        held = np.concatenate(clips)
        np.testing.assert_array_equal(held[1:], video[:end])  # the first frame once more in front
        np.testing.assert_array_equal(held[0], video[0])
    leaders = chain_leaders(requests)
    assert len(leaders) == len({end % 2 for end in ends})  # one chain per place in a pair
    for request in requests:
        (leader,) = [r for r in leaders if r.videos()[0] is request.videos()[0]]
        assert all(a is b for a, b in zip(request.videos(), leader.videos(), strict=False))
    if points == frames:  # every clip one pair in both layouts: as many clips (tokens) as the tail layout's
        assert [len(a.videos()) for a in requests] == [len(b.videos()) for b in tails]


def test_the_tail_layout_has_one_chain_and_a_lone_first_tail():
    requests = load_profile("qwen2_5_vl_vllm").build_curve(TASK, ramp(16), BackendKwargs(), "auto", 16)
    assert chain_leaders(requests) == [requests[0], requests[-1]]  # point 1 shows only its own tail
    assert chain_leaders(requests[1:]) == [requests[-1]]


def test_a_curve_gives_each_item_its_points_share_one_id():
    """The ids vLLM keys its processor cache and its prefix cache by (vllm_curves): one per item
    that several points show, the clips and PRIMO-R1's first frame alike, and one of its own for
    every other item."""
    profile = load_profile("PRIMO-R1")
    requests = profile.build_curve(TASK, ramp(16), BackendKwargs(), "auto", 16)
    assign_clip_ids(requests, "curve")
    first = {r.image_ids[0] for r in requests[1:]}  # point 1 shows only its own tail (frame 0 doubled)
    assert len(first) == 1 and requests[0].image_ids[0] not in first
    lasts = [r.image_ids[1] for r in requests]  # each point's own last frame
    assert len(set(lasts)) == 16 and not set(lasts) & first
    longest = requests[-1].clip_ids
    assert len(set(longest)) == 8
    for end, request in enumerate(requests, start=1):
        shared = request.clip_ids[:-1] if end % 2 else request.clip_ids
        assert shared == longest[: len(shared)]  # the clips it shares, under the longest point's ids
        if end % 2:
            assert request.clip_ids[-1] not in longest  # its tail: an id of its own
        assert item_ids(request) == {"video": request.clip_ids, "image": request.image_ids}
    single = profile.build(TASK, ramp(16), BackendKwargs(), "auto")  # outside a curve: unique every time
    assert set(item_ids(single)["image"]).isdisjoint(item_ids(single)["image"])


def test_curve_on_score_rises_and_ends_at_the_score(server):
    frames = ramp(16)
    base = {"task_text": TASK, "frames": inline(frames), "backend_kwargs": {"score_mode": "logprob"}}
    plain = post(f"{server.url}/score", json=base).json()
    assert plain["progress"] is None
    r = post(f"{server.url}/score", json={**base, "progress_points": 4})
    assert r.status_code == 200, r.text
    answer = r.json()
    expected = [float(frames[e - 1].mean()) / 255 for e in prefix_ends(16, 4)]
    assert answer["progress"] == pytest.approx(expected, abs=1e-4)
    assert answer["score"] == answer["progress"][-1] == pytest.approx(plain["score"])
    assert answer["prompt_tokens"] > plain["prompt_tokens"]  # all points' prompts together


def test_curve_in_generation_mode(server):
    r = post(f"{server.url}/score", json={"task_text": TASK, "frames": inline(ramp(8)), "progress_points": 8})
    assert r.status_code == 200, r.text
    progress = r.json()["progress"]
    assert len(progress) == 8 and progress == sorted(progress) and progress[-1] == r.json()["score"] == 1.0


def test_bad_progress_points_are_422_naming_the_range(server):
    frames = inline(ramp(6))
    for points, says in [(0, "greater than or equal to 1"), (257, "less than or equal to 256"), (-3, "equal to 1")]:
        r = post(f"{server.url}/score", json={"task_text": TASK, "frames": frames, "progress_points": points})
        assert r.status_code == 422, r.text
        assert "progress_points" in r.text and says in r.text, r.text
    # more points than the frames the model sees (6 frames -> nframes 6)
    r = post(f"{server.url}/score", json={"task_text": TASK, "frames": frames, "nframes": 6, "progress_points": 7})
    assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request"
    assert "allowed 1..6" in r.json()["error"]["message"]
    # more than this server allows (--max-progress-points 16)
    r = post(
        f"{server.url}/score",
        json={"task_text": TASK, "frames": inline(ramp(32)), "nframes": 32, "progress_points": 20},
    )
    assert r.status_code == 422 and "allowed 1..16" in r.json()["error"]["message"]
    assert get(f"{server.url}/health").status_code == 200


def test_batches_json_and_raw_carry_curves_item_by_item(server):
    frames = ramp(12)
    items = [
        {"task_text": TASK, "frames": inline(frames), "progress_points": 3},
        {"task_text": TASK, "frames": inline(frames), "nframes": 4, "progress_points": 5},  # bad: 4 frames
        {"task_text": TASK, "frames": inline(frames)},
    ]
    by_json = post(f"{server.url}/score/batch", json={"requests": items}).json()["results"]
    options = [
        ScoreOptions(task_text=TASK, progress_points=3),
        ScoreOptions(task_text=TASK, nframes=4, progress_points=5),
        ScoreOptions(task_text=TASK),
    ]
    body = raw_batch.encode([(o, frames) for o in options])
    assert b'"progress_points":3' in body.tobytes()  # in the raw header; K = 1 stays implicit
    by_raw = post(
        f"{server.url}/score/batch", content=body.tobytes(), headers={"content-type": raw_batch.CONTENT_TYPE}
    ).json()["results"]
    for results in (by_json, by_raw):
        assert len(results[0]["response"]["progress"]) == 3
        assert results[1]["error"]["type"] == "invalid_request" and "allowed 1..4" in results[1]["error"]["message"]
        assert results[2]["response"]["progress"] is None
        assert results[0]["response"]["score"] == results[2]["response"]["score"]
    with RewardClient(server.url) as client:  # the hook's client sends it the raw way
        got = client.score_episodes([(options[0], frames)])
    assert got[0].response.progress == by_raw[0]["response"]["progress"]


def test_unparsable_points_are_null_and_counted():
    with InProcessServer(engine_option=["answer=no idea"]) as s:
        r = post(f"{s.url}/score", json={"task_text": TASK, "frames": inline(ramp(8)), "progress_points": 4})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["progress"] == [None] * 4 and answer["score"] is None
        assert answer["parse_status"] == "no_number"
        metrics = get(f"{s.url}/metrics").text
        assert 'reward_parse_failures_total{status="no_number"} 4.0' in metrics
        assert "reward_curve_points_total 4.0" in metrics
        stats = get(f"{s.url}/stats").json()
        assert stats["curves"] == 1 and stats["requests"] == 4
