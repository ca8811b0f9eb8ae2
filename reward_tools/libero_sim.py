"""LIBERO helpers for drivers that run RLinf's LiberoEnv in the simulator environment (numpy < 2,
RLinf, LIBERO): the env config of a run as RLinf's Hydra composes it, and a simulator state in which
task 0 is done. Imported there only; the simulator's packages are imported inside the functions."""

from __future__ import annotations

import os

import numpy as np


def compose_env_config(config_dir: str, run: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    os.environ.setdefault("EMBODIED_PATH", os.path.dirname(config_dir))
    with initialize_config_dir(config_dir=config_dir, version_base="1.1"):
        name = run if run.startswith("libero_") else f"libero_10_grpo_openvlaoft_{run}"
        cfg = compose(config_name=name, overrides=overrides)
    return cfg.env.train


def goal_state(env, env_id: int) -> np.ndarray:
    """Env env_id's simulator state with both task-0 objects moved into the basket."""
    from libero.libero.envs import OffScreenRenderEnv

    params = env.get_env_fn_params([env_id])[0]
    params.pop("seed")
    params.update(camera_heights=64, camera_widths=64)
    mirror = OffScreenRenderEnv(**params)
    mirror.reset()
    state = np.array(env.env.get_sim_state()[env_id], dtype=np.float64)
    mirror.set_init_state(state)
    sim = mirror.sim
    basket = next(n for n in sim.model.body_names if n.startswith("basket_1"))
    target = np.array(sim.data.body_xpos[sim.model.body_name2id(basket)])
    for obj, dx in (("alphabet_soup_1", -0.025), ("tomato_sauce_1", 0.025)):
        start, _ = sim.model.get_joint_qpos_addr(f"{obj}_joint0")
        state[1 + start : 1 + start + 3] = target + np.array([dx, 0.0, 0.04])
    mirror.close()
    return state
