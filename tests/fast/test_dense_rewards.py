"""Dense rewards from progress curves in the RLinf hook, against the fake engine (it scores the
brightness of the last frame it sees, so a curve over frames that brighten step by step is known
in advance). The env side is RLinf's arithmetic and its env worker's per-chunk reward buffer as
rlinf_patches/env_worker.patch drives it; the same on the real simulator and RLinf's own rollout
buffer: tests/test_rlinf_integration.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.dense import PlacementError, moves, place, point_frames
from reward_client.rlinf.hook import VLMRewardHook
from reward_protocol.frames import QWEN2_5_VL
from reward_protocol.progress import prefix_ends
from tests.helpers.servers import InProcessServer

N, COEF, CHUNK = 3, 5.0, 4
TASKS = ["put the bowl on the plate"] * N


@pytest.fixture(scope="module")
def server():
    with InProcessServer() as s:
        yield s


def hook(server, use_rel_reward: bool = True, **options) -> VLMRewardHook:
    options.setdefault("progress_points", 4)
    config = RewardModelConfig(enable=True, url=server.url, score_mode="logprob", wait_ready_s=5, **options)
    return VLMRewardHook(config, num_envs=N, reward_coef=COEF, use_rel_reward=use_rel_reward)


def brightness(step: int) -> int:
    return min(255, 8 * step)


def frames(step: int) -> np.ndarray:
    return np.full((N, 56, 56, 3), brightness(step), dtype=np.uint8)


def epoch(h: VLMRewardHook, done_at: dict[int, int], steps: int, rel: bool = True) -> np.ndarray:
    """One rollout epoch as RLinf runs it: LIBERO's _calc_step_reward on the hook's value, chunk
    by chunk, the env worker keeping each chunk's rewards and calling place_rewards after each
    (the patch). Returns the rewards the actor would get, [N, steps]."""
    h.on_reset(None, frames(0))
    prev = np.zeros(N)
    kept: list[np.ndarray] = []  # the worker's rollout rewards of this epoch, one [N, CHUNK] per chunk
    for chunk in range(steps // CHUNK):
        current = np.zeros((N, CHUNK))
        for slot in range(CHUNK):
            t = chunk * CHUNK + slot + 1  # actions taken so far
            terms = np.array([t >= done_at.get(e, 10**9) for e in range(N)])
            reward = COEF * h.on_step(frames(t), TASKS, terms, np.full(N, t >= steps))
            if rel:
                reward, prev = reward - prev, reward
            current[:, slot] = reward
        h.place_rewards(current, kept, chunk)
        kept.append(current)
    return np.concatenate(kept, axis=1)


def test_each_point_is_rewarded_where_its_prefix_ends(server):
    h = hook(server, nframes=8)
    rewards = epoch(h, done_at={0: 6, 1: 13}, steps=16)  # env 2 truncates at 16
    info = h.episode_info()
    for env, done in ((0, 6), (1, 13), (2, 16)):
        steps = h.buffers.steps(env)  # the frames sent (step 0: the reset frame)
        ends = point_frames(steps, 8, 4, QWEN2_5_VL)
        curve = [brightness(s) / 255 for s in ends]  # what the fake judge says at each prefix
        expected = np.zeros(16)
        previous = 0.0
        for step, value in zip(ends, curve, strict=True):
            expected[max(step - 1, 0)] += COEF * (value - previous)
            previous = value
        np.testing.assert_allclose(rewards[env], expected, atol=1e-4)
        assert rewards[env].sum() == pytest.approx(COEF * info["vlm_score"][env], abs=1e-4)
        assert np.count_nonzero(rewards[env][done:]) == 0  # nothing after the first done step
        assert info["vlm_moved_reward"][env] == pytest.approx(COEF * info["vlm_score"][env] - rewards[env][done - 1])
        assert ends[-1] == done  # the last point is the whole episode
    assert h.placed > 0 and not h.pending


def test_without_rel_reward_a_curve_changes_no_reward(server):
    dense = epoch(hook(server, use_rel_reward=False), done_at={0: 5}, steps=8, rel=False)
    plain = epoch(hook(server, use_rel_reward=False, progress_points=1), done_at={0: 5}, steps=8, rel=False)
    # the value holds after the done step as LIBERO's termination flag would; the curve's last
    # point and the single score see the episode laid out differently, so compare the shape
    assert np.count_nonzero(dense[0, :4]) == 0 and np.all(dense[0, 4:] == dense[0, 4])
    assert np.count_nonzero(plain[0, :4]) == 0


def test_short_episodes_ask_for_at_most_their_frames(server):
    h = hook(server, nframes=16, progress_points=16)
    rewards = epoch(h, done_at={0: 4}, steps=8)  # 5 frames -> the model sees 6: a curve of 6 points
    assert h.counts["scored"] == N and h.counts["request_errors"] == 0
    assert rewards[0].sum() == pytest.approx(COEF * h.episode_info()["vlm_score"][0], abs=1e-4)
    assert np.count_nonzero(rewards[0][:4]) == 4  # frames 1..4 end points of their own


def test_dense_needs_episodes_aligned_with_the_rollout_epoch(server):
    config = RewardModelConfig(enable=True, url=server.url, wait_ready_s=5, progress_points=4)
    with pytest.raises(ValueError, match="auto_reset: False"):
        VLMRewardHook(config, num_envs=N, use_rel_reward=True, auto_reset=True)
    VLMRewardHook(config, num_envs=N, use_rel_reward=False, auto_reset=True)  # no placement: fine


def test_moves_that_nobody_placed_are_dropped_with_a_warning(server, caplog):
    h = hook(server, nframes=8)
    h.on_reset(None, frames(0))
    for t in range(1, 9):
        h.on_step(frames(t), TASKS, np.zeros(N, bool), np.full(N, t == 8))
    assert h.pending  # the env worker patch never asked for them
    with caplog.at_level(logging.WARNING, logger="reward_client.rlinf.hook"):
        h.on_reset(None, frames(0))
    assert not h.pending and "env_worker.patch" in caplog.text


def test_moves_and_placement_by_hand():
    # points end at frames 2, 4, 8 of an episode done at action 7 (frame 8)
    assert moves([2, 4, 8], [0.2, 0.5, 0.6], done_action=7, reward_coef=2.0) == [
        (1, pytest.approx(0.4)),
        (3, pytest.approx(0.6)),
        (7, pytest.approx(-1.0)),
    ]
    assert moves([0, 8], [0.3, 0.3], done_action=7, reward_coef=1.0) == [(0, 0.3), (7, -0.3)]  # reset frame: action 0
    assert moves([8], [0.9], done_action=7, reward_coef=1.0) == []
    earlier = [np.zeros((2, 4)), np.zeros((2, 4))]
    current = np.zeros((2, 4))
    assert place({1: [(1, 0.4), (9, -0.4)]}, current, earlier, chunk_index=2) == 2
    assert earlier[0][1, 1] == 0.4 and current[1, 1] == -0.4
    with pytest.raises(PlacementError, match="auto_reset"):
        place({0: [(1, 1.0)]}, current, earlier[1:], chunk_index=2)
    assert earlier[1].sum() == 0  # nothing placed when one move cannot be
    steps = [0, 1, 2, 3, 4]  # a short episode: the server pads to 6 frames with the last one
    assert point_frames(steps, 16, 6, QWEN2_5_VL) == [0, 1, 2, 3, 4, 4]
    assert prefix_ends(6, 3) == [2, 4, 6] and point_frames(steps, 16, 3, QWEN2_5_VL) == [1, 3, 4]


def test_the_audit_and_the_motion_canaries_read_the_curves(server):
    """VOC (reward_protocol.progress) of every curve: the real episodes brighten, so the fake judge's
    curves only rise; on their reversed probes they only fall, and a static probe has no order."""
    kinds = ["static", "reversed", "wrong_task"]
    h = hook(server, nframes=8, canary_fraction=1.0, canary_kinds=kinds, canary_tasks=["open the drawer"])
    epoch(h, done_at={0: 6, 1: 13}, steps=16)
    info = {k: v[0] for k, v in h.episode_info().items() if "voc" in k}
    assert info == pytest.approx(
        {
            "vlm_audit/voc": 1.0,
            "vlm_audit/put_the_bowl_on_the_plate/voc": 1.0,
            "vlm_canary/reversed_voc": -1.0,  # a judge blind to motion would rise here too
        }
    )
    assert h.counts["canaries"] == 3 * N and h.counts["canary_failures"] == 0
