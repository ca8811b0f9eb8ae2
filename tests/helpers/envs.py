"""Stand-ins for RLinf's envs where a test needs only their shape: ManiSkill's batched env object,
and the env config the patched env reads its reward model from."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

N_ENVS, COEF = 4, 2.5


class StandInManiskill:
    """What the adapter reads of RLinf's ManiskillEnv: num_envs, device, env.unwrapped."""

    def __init__(self, instruction=None):
        unwrapped = SimpleNamespace()
        if instruction is not None:
            unwrapped.get_language_instruction = lambda: instruction
        self.env = SimpleNamespace(unwrapped=unwrapped)
        self.num_envs = N_ENVS
        self.device = torch.device("cpu")


def env_cfg(url: str, **reward_model) -> OmegaConf:
    return OmegaConf.create(
        {
            "reward_mode": "raw",
            "reward_coef": COEF,
            "ignore_terminations": False,
            "init_params": {"id": "PickCube-v1"},
            "reward_model": {"enable": True, "url": url, "nframes": 4, "wait_ready_s": 30, **reward_model},
        }
    )
