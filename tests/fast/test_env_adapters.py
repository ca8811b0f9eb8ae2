"""The per-env adapters against the real app on the fake engine (fast tier).

ManiSkill's env is batched: one env object holds every env of its worker as torch tensors. The
stand-in (tests/helpers/envs.py) has the shape RLinf's ManiskillEnv gives the adapter (num_envs, device, the gym
env's `unwrapped`); the patched env on the real simulator is exercised in
tests/maniskill/test_rlinf_maniskill.py. The fake engine answers the last frame's brightness as the score.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.env_adapters import MANISKILL_TASKS, ManiSkillAdapter
from reward_client.rlinf.hook import VLMRewardHook
from tests.helpers.envs import COEF, StandInManiskill, env_cfg
from tests.helpers.envs import N_ENVS as N
from tests.helpers.servers import InProcessServer


@pytest.fixture(scope="module")
def server():
    with InProcessServer() as s:
        yield s


def obs(t: int, bright: list[int] | None = None) -> dict:
    """Torch frames like ManiSkill's base camera; env e's frame has brightness bright[e] * t."""
    bright = bright or [20] * N
    frames = torch.stack([torch.full((32, 32, 3), min(255, b * t), dtype=torch.uint8) for b in bright])
    return {"main_images": frames, "states": torch.zeros(N, 42)}


def test_libero_step_takes_terminations_as_success(server):
    # LIBERO's patch calls the hook itself: its termination is its success (what the audit and
    # the env_success fallback measure against), its truncation is no success
    hook = VLMRewardHook(RewardModelConfig(enable=True, url=server.url, wait_ready_s=5), 2)
    blank = np.zeros((2, 8, 8, 3), np.uint8)
    hook.on_reset(None, blank)
    hook.on_step(blank, ["a", "b"], [True, False], [False, True], [3, 4])
    assert hook.env_success.tolist() == [True, False] and hook.counts["episodes"] == 2


def test_maniskill_rewards_are_coef_times_score_once_per_episode_in_one_batch(server):
    adapter = ManiSkillAdapter(StandInManiskill(), env_cfg(server.url))
    seen, batches = len(server.engine.seen), adapter.counts["batches"]
    adapter.on_reset(None, obs(0))
    success = torch.tensor([True, False, False, False])
    rewards = []
    for t in range(1, 7):
        terminated = success & (t >= 3)  # env 0 succeeds at step 3; the others truncate at 6
        truncated = torch.full((N,), t == 6)
        infos = {"success": terminated.clone(), "fail": torch.zeros(N, dtype=torch.bool)}
        reward = adapter.on_step(obs(t, [40, 10, 20, 30]), infos, terminated, truncated)
        assert reward.dtype == torch.float32 and reward.shape == (N,)
        rewards.append(reward)
    rewards = torch.stack(rewards, dim=1).numpy()
    info = adapter.episode_info()
    scores = info["vlm_score"].numpy()
    # the fake engine's score: the last sent frame's brightness on a 0-100 scale, parsed as a fraction
    assert scores == pytest.approx([round(b / 255 * 100) / 100 for b in (40 * 3, 10 * 6, 20 * 6, 30 * 6)])
    assert rewards[0].tolist() == pytest.approx([0, 0] + [COEF * scores[0]] * 4)  # held, as a termination is
    assert (rewards[1:, :5] == 0).all() and rewards[1:, 5] == pytest.approx(COEF * scores[1:])
    assert adapter.counts["batches"] - batches == 2  # env 0 alone, then the three that truncated together
    assert adapter.counts["fallbacks"] == 0 and info["vlm_fallback"].tolist() == [0.0] * N
    texts = [" ".join(p.text for p in r.chat.user if hasattr(p, "text")) for r in server.engine.seen[seen:]]
    assert len(texts) == N and all(MANISKILL_TASKS["PickCube-v1"] in t for t in texts)
    assert info["vlm_audit/episodes"][0] == N  # audited against infos["success"]
    assert info["vlm_audit/score_success"][0] == pytest.approx(scores[0], abs=1e-6)


def test_a_partial_reset_starts_only_those_episodes(server):
    adapter = ManiSkillAdapter(StandInManiskill(), env_cfg(server.url))
    adapter.on_reset(None, obs(0))
    done = torch.full((N,), True)
    adapter.on_step(obs(1), {"success": done}, done, ~done)
    adapter.on_reset(torch.tensor([1, 3]), obs(0))  # ManiSkill's auto reset passes the ended envs
    assert adapter.hook.judged.tolist() == [True, False, True, False]
    assert adapter.hook.buffers.length(1) == 1


def test_the_tasks_own_instruction_wins_then_task_text(server):
    instructions = [f"put object {e} on the plate" for e in range(N)]
    own = ManiSkillAdapter(StandInManiskill(instruction=instructions), env_cfg(server.url))
    assert own.tasks() == instructions
    configured = ManiSkillAdapter(StandInManiskill(), env_cfg(server.url, task_text="lift the cube"))
    assert configured.tasks() == ["lift the cube"] * N
    cfg = env_cfg(server.url)
    cfg.init_params.id = "SomeOtherTask-v1"
    with pytest.raises(ValueError, match=r"set env\.train\.reward_model\.task_text"):
        ManiSkillAdapter(StandInManiskill(), cfg).tasks()


def test_settings_the_judge_cannot_work_with_are_clear_errors(server):
    cfg = env_cfg(server.url)
    cfg.reward_mode = "default"
    with pytest.raises(ValueError, match="reward_mode: raw"):
        ManiSkillAdapter(StandInManiskill(), cfg)
    adapter = ManiSkillAdapter(StandInManiskill(), env_cfg(server.url))
    with pytest.raises(ValueError, match="obs_mode: rgb"):
        adapter.on_reset(None, {"states": torch.zeros(N, 42)})


def test_no_server_falls_back_counted_when_asked():
    lenient = {"fail_on_request_error": False, "fallback": "env_success", "wait_ready_s": 0, "deadline_s": 1}
    cfg = env_cfg("http://127.0.0.1:9", **lenient)
    adapter = ManiSkillAdapter(StandInManiskill(), cfg)
    adapter.on_reset(None, obs(0))
    success = torch.tensor([True, False, True, False])
    reward = adapter.on_step(obs(1), {"success": success}, success, torch.full((N,), True))
    assert reward.tolist() == [COEF, 0.0, COEF, 0.0]  # the env's own flag, flagged as a fallback
    assert adapter.episode_info()["vlm_fallback"].tolist() == [1.0] * N
    assert adapter.counts["fallbacks"] == N and adapter.counts["request_errors"] == 1


def test_the_hook_builds_from_an_rlinf_config_with_task_text(server):
    hook = VLMRewardHook.from_rlinf_config(env_cfg(server.url, task_text="lift the cube"), N)
    assert isinstance(hook.config, RewardModelConfig) and hook.config.task_text == "lift the cube"
