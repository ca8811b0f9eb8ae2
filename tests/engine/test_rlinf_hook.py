"""The reward mapping of the RLinf hook, option by option, against a real server.

RLinf's arithmetic is `reward = penalty + reward_coef * X` (minus the previous step's under
use_rel_reward); the hook supplies X. These tests apply that arithmetic to the hook's output;
the patched LiberoEnv itself is exercised in test_rlinf_integration.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.hook import VLMRewardHook
from tests.helpers.servers import requests_served, start_server

N, COEF = 4, 5.0
TASKS = ["put the bowl on the plate"] * N


def hook(server, **options) -> VLMRewardHook:
    config = RewardModelConfig(enable=True, url=server.url, score_mode="logprob", wait_ready_s=30, **options)
    return VLMRewardHook(config, num_envs=N)


def frames(t: int) -> np.ndarray:
    f = np.zeros((N, 56, 56, 3), dtype=np.uint8)
    f[:, :, : min(56, 4 * (t + 1))] = 180
    return f


def rollout(h: VLMRewardHook, term_at: dict[int, int], trunc_at: int, steps: int, rel: bool = True) -> np.ndarray:
    """RLinf's _calc_step_reward over a scripted episode; returns rewards [N, steps]."""
    h.on_reset(None, frames(0))
    prev = np.zeros(N)
    out = []
    for t in range(1, steps + 1):
        terms = np.array([t >= term_at.get(e, 10**9) for e in range(N)])  # success holds once reached
        truncs = np.full(N, t >= trunc_at)
        reward = COEF * h.on_step(frames(t), TASKS, terms, truncs)
        if rel:
            reward, prev = reward - prev, reward
        out.append(reward)
    return np.stack(out, axis=1)


def test_bonus_once_at_the_first_done_step_including_truncation(hf_server):
    h = hook(hf_server)
    rewards = rollout(h, term_at={0: 3, 1: 5}, trunc_at=8, steps=10)
    scores = h.episode_info()["vlm_score"]
    assert np.all((scores > 0) & (scores < 1))
    for env, done in ((0, 3), (1, 5), (2, 8), (3, 8)):
        assert rewards[env, done - 1] == pytest.approx(COEF * scores[env])
        assert np.count_nonzero(rewards[env]) == 1  # never scored again while it keeps stepping
    assert h.counts == {**h.counts, "episodes": 4, "scored": 4, "batches": 3}  # envs 2 and 3 together


def test_without_rel_reward_the_value_holds_like_a_termination(hf_server):
    h = hook(hf_server)
    rewards = rollout(h, term_at={0: 2}, trunc_at=4, steps=5, rel=False)
    score0 = h.episode_info()["vlm_score"][0]
    assert rewards[0].tolist() == pytest.approx([0, COEF * score0, COEF * score0, COEF * score0, COEF * score0])


def test_binary_reward_thresholds_the_score(hf_server):
    h = hook(hf_server, binary_reward=True, success_threshold=0.0)
    rewards = rollout(h, term_at={}, trunc_at=2, steps=2)
    assert rewards[:, -1].tolist() == [COEF] * N  # every score >= 0
    h = hook(hf_server, binary_reward=True, success_threshold=1.0)
    assert rollout(h, term_at={}, trunc_at=2, steps=2)[:, -1].tolist() == [0.0] * N


def test_truncated_episodes_can_be_left_unscored(hf_server):
    h = hook(hf_server, score_on_truncation=False)
    rewards = rollout(h, term_at={1: 2}, trunc_at=3, steps=3)
    assert np.count_nonzero(rewards[1]) == 1
    assert not rewards[[0, 2, 3]].any() and h.counts["episodes"] == 1


def test_ignore_terminations_scores_only_at_truncation(hf_server):
    config = RewardModelConfig(enable=True, url=hf_server.url, score_mode="logprob", wait_ready_s=30)
    h = VLMRewardHook(config, num_envs=N, ignore_terminations=True)
    rewards = rollout(h, term_at={0: 1}, trunc_at=3, steps=3)
    assert not rewards[:, :2].any() and h.counts["batches"] == 1


def test_reset_starts_a_new_episode(hf_server):
    h = hook(hf_server)
    rollout(h, term_at={}, trunc_at=2, steps=2)
    assert h.judged.all()
    h.on_reset([1], frames(0))
    assert h.judged.tolist() == [True, False, True, True] and h.values[1] == 0.0
    assert h.buffers.length(1) == 1


def test_canaries_ride_in_the_same_batch_and_never_touch_rewards(hf_server):
    plain = hook(hf_server)
    probed = hook(hf_server, canary_fraction=1.0, canary_tasks=["open the top drawer"])
    expected = rollout(plain, term_at={0: 3}, trunc_at=6, steps=6)
    before = requests_served(hf_server, "/score/batch")
    rewards = rollout(probed, term_at={0: 3}, trunc_at=6, steps=6)
    assert requests_served(hf_server, "/score/batch") - before == 2  # env 0 alone, then envs 1-3: probes rode along
    assert probed.counts == {**plain.counts, "canaries": 3 * N}
    # the same episodes' scores; probes in a batch change the engine's padding, hence float32 rounding
    np.testing.assert_allclose(rewards, expected, rtol=1e-5, atol=1e-6)
    info = probed.episode_info()
    for kind in ("static", "reversed", "wrong_task"):
        assert 0.0 <= info[f"vlm_canary/{kind}"][0] <= 1.0 and len(set(info[f"vlm_canary/{kind}"])) == 1
    assert info["vlm_fallback"].tolist() == [0.0] * N and info["vlm_canary/failed"][0] == 0.0
    assert "vlm_canary/static" not in plain.episode_info()


def test_probes_beyond_the_body_limit_are_split_to_fit_and_never_fail_training(tiny_checkpoint, video_dir, tmp_path):
    server = start_server(["--engine", "hf", "--max-body-mb", "1"], tiny_checkpoint, video_dir, tmp_path)
    try:  # 4 episodes of 9 frames fit in 1 MB; with 12 probes beside them they do not: the client
        # reads the limit from /health and sends the batch in parts that fit (it was a 413 whose
        # probes all counted as canary failures)
        h = hook(server, canary_fraction=1.0, canary_tasks=["open the top drawer"])
        rewards = rollout(h, term_at={}, trunc_at=8, steps=8)
    finally:
        server.stop()
    scores = h.episode_info()["vlm_score"]
    assert rewards[:, -1] == pytest.approx(COEF * scores) and np.all(scores > 0)
    assert h.counts["scored"] == N and h.counts["fallbacks"] == 0 and h.counts["request_errors"] == 0
    assert h.counts["canaries"] == 3 * N and h.counts["canary_failures"] == 0
    assert h.episode_info()["vlm_canary/failed"][0] == 0
