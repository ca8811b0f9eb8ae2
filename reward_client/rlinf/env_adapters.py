"""The VLM reward inside RLinf's ManiSkill env: the adapter its patch builds, which owns a hook.

The hook (reward_client.rlinf.hook) knows episodes, frames, requests and rewards; it does not
know where an env keeps its camera frames, which flag means success, or where the instruction
comes from. LIBERO's patch hands the hook host arrays in the hook's own terms (`on_reset` /
`on_step`: its termination is its success), so it needs no adapter. ManiSkill's does:

- ManiSkill (`ManiSkillAdapter`): batched torch tensors on the env's device (one env object
  runs every env of its worker), frames `obs["main_images"]` (the base camera under
  `obs_mode: rgb`; `reward_model.views` may add the cameras of `extra_view_images`), success
  `infos["success"]` (a termination may also be `fail`), the instruction from the task when it
  has one, else `reward_model.task_text`, else this module's default for the ManiSkill task id.
  RLinf's ManiSkill env has no `reward_coef`; the adapter scales the judge's value by
  `env.*.reward_coef` (default 1) and hands it to `_calc_step_reward` in place of the
  simulator's reward, so RLinf's own `use_rel_reward` arithmetic applies to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reward_client.rlinf.deferred import MANISKILL_RETURNS
from reward_client.rlinf.hook import EnvStep, VLMRewardHook
from reward_client.rlinf.views import View, frames_of, to_numpy


def flags(value: Any, num_envs: int) -> np.ndarray:
    """Per-env booleans; a single bool (a one-env ManiSkill step) stands for every env."""
    return np.broadcast_to(to_numpy(value).astype(bool).reshape(-1), (num_envs,)).copy()


# Instructions for ManiSkill tasks that have none of their own (`get_language_instruction`).
# PickCube's is the one RLinf's own VLM-reward config for it uses.
MANISKILL_TASKS = {
    "PickCube-v1": "Pick up the red cube and place it on the green spot on the table.",
    "PickCube3View-v1": "Pick up the red cube and place it on the green spot on the table.",
    "PushCube-v1": "Push the cube onto the red and white target on the table.",
    "StackCube-v1": "Stack the red cube on top of the green cube.",
    "PullCube-v1": "Pull the cube onto the red and white target on the table.",
}


class ManiSkillAdapter:
    """The judge inside RLinf's ManiskillEnv (the object its patch holds as `vlm_reward`)."""

    def __init__(self, env: Any, cfg: Any, hook: VLMRewardHook | None = None):
        if cfg.get("reward_mode", "default") != "raw":
            raise ValueError(
                f"env reward_model needs reward_mode: raw (got {cfg.get('reward_mode', 'default')!r}): the "
                "judge's value replaces the simulator's reward, which only the raw mode passes through"
            )
        self.env = env
        self.num_envs = int(env.num_envs)
        self.reward_coef = float(cfg.get("reward_coef", 1.0))
        self.hook = hook or VLMRewardHook.from_rlinf_config(cfg, self.num_envs, returns=MANISKILL_RETURNS)
        self.task_id = str(cfg.init_params.id)
        self._fixed_task = self.hook.config.task_text or MANISKILL_TASKS.get(self.task_id)

    def tasks(self) -> list[str]:
        """The task's own instruction(s) when it has them (RLinf's scene tasks), else a fixed one."""
        unwrapped = self.env.env.unwrapped
        if hasattr(unwrapped, "get_language_instruction"):
            own = unwrapped.get_language_instruction()
            own = [own] * self.num_envs if isinstance(own, str) else list(own)
            if len(own) == self.num_envs:
                return [str(t) for t in own]
        if self._fixed_task is None:
            raise ValueError(
                f"ManiSkill task {self.task_id} has no language instruction and none is known here: set "
                f"env.train.reward_model.task_text (known: {', '.join(sorted(MANISKILL_TASKS))})"
            )
        return [self._fixed_task] * self.num_envs

    def _frames(self, obs: dict) -> tuple[np.ndarray, list[View]]:
        if obs.get("main_images") is None:
            raise ValueError(
                "the VLM reward needs camera frames, and this ManiSkill env gives none (obs_mode state?): set "
                "env.train.init_params.obs_mode: rgb (use_full_state: True keeps a state policy's input)"
            )
        return frames_of(obs, self.hook.config.views)

    def view(self, obs: dict, infos: dict, terminations: Any, truncations: Any) -> EnvStep:
        success = infos.get("success", terminations)  # a task without a success check: its terminations
        frames, views = self._frames(obs)
        return EnvStep(
            frames=frames,
            tasks=self.tasks(),
            terminations=flags(terminations, self.num_envs),
            truncations=flags(truncations, self.num_envs),
            success=flags(success, self.num_envs),
            views=views,
        )

    def on_reset(self, env_idx: Any, obs: dict) -> None:
        """Episodes start for env_idx (None: every env); obs holds all envs' current observation."""
        self.hook.start(None if env_idx is None else to_numpy(env_idx), *self._frames(obs))

    def on_step(self, obs: dict, infos: dict, terminations: Any, truncations: Any) -> Any:
        """The reward to hand `_calc_step_reward` in place of the simulator's: reward_coef x the
        hook's value (0 until an episode first ends, then the judge's score), as a float32 tensor
        on the env's device."""
        import torch

        values = self.hook.step(self.view(obs, infos, terminations, truncations))
        return torch.as_tensor(self.reward_coef * values, dtype=torch.float32, device=self.env.device)

    def place_rewards(self, current: Any, earlier: list[Any], chunk_index: int, **worker: Any) -> int:
        """RLinf's env worker hands over its rewards (and, for async judging, the episode metrics
        it read) after each chunk step: the hook's `place_rewards`."""
        return self.hook.place_rewards(current, earlier, chunk_index, **worker)

    def episode_info(self) -> dict[str, Any]:
        """The hook's per-episode values as tensors on the env's device, for `infos["episode"]`."""
        import torch

        return {
            k: torch.as_tensor(v, dtype=torch.float32, device=self.env.device)
            for k, v in self.hook.episode_info().items()
        }

    @property
    def counts(self) -> dict[str, int]:
        return self.hook.counts
