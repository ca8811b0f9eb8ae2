"""Drives RLinf's real (patched) ManiskillEnv inside the simulator's own Python environment.

Run by tests/test_rlinf_maniskill.py with the simulator environment's interpreter (ManiSkill 3,
SAPIEN rendering on Mesa's lavapipe on a CPU machine); prints nothing, writes one JSON object.

    python tests/maniskill_driver.py --rlinf-dir DIR --config-dir DIR --out FILE --url URL ...

PickCube-v1 on ManiSkill's CPU physics (one env per env object there; the GPU backend batches
many), stepped through `chunk_step` with auto reset as RLinf's env worker does, action chunks of
1. Episode 1 succeeds: after --goal-step steps the goal site is moved onto the cube, which sits
still with the arm at rest (ManiSkill's own success check then fires). The env resets itself,
and episode 2 runs into the time limit (truncation): its goal is held 25 cm above the cube, out
of reach of an arm at rest (RLinf's auto reset draws the new goal without a seed, and once in a
CI run it landed where episode 2 counted as a success at its first step). Every step's frame is
saved.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np


def compose_env_config(args):
    from hydra import compose, initialize_config_dir

    os.environ.setdefault("EMBODIED_PATH", os.path.dirname(args.config_dir))
    rm = "env.train.reward_model"
    overrides = [
        "env.train.init_params.sim_backend=cpu",
        "+env.train.init_params.render_backend=cpu",  # the Vulkan device is the CPU (lavapipe)
        f"env.train.init_params.sensor_configs.width={args.size}",
        f"env.train.init_params.sensor_configs.height={args.size}",
        f"env.train.max_episode_steps={args.max_steps}",
        f"env.train.reward_coef={args.reward_coef}",
        f"{rm}.enable={args.reward}",
        f"{rm}.url={args.url}",
        f"{rm}.nframes={args.nframes}",
        f"{rm}.fail_on_request_error={args.fail_on_request_error}",
        f"{rm}.fallback={args.fallback}",
        f"{rm}.wait_ready_s={args.wait_ready_s}",
        f"{rm}.deadline_s={args.deadline_s}",
        f"{rm}.timeout_s={min(args.deadline_s, 300)}",
        f"{rm}.canary_fraction=0",
        f"{rm}.async=False",  # the rewards are read from the env itself, not from RLinf's rollout buffer
    ]
    with initialize_config_dir(config_dir=args.config_dir, version_base="1.1"):
        cfg = compose(config_name=f"maniskill_ppo_mlp_{args.run}", overrides=overrides)
    return cfg.env.train


def move_goal_onto_cube(env, height: float = 0.0) -> None:
    """PickCube's success: the cube within 2.5 cm of the goal, and the robot at rest."""
    import sapien

    task = env.env.unwrapped
    cube = task.cube.pose.p[0].cpu().numpy()
    task.goal_site.set_pose(sapien.Pose(p=cube + np.array([0.0, 0.0, height], dtype=cube.dtype)))


def frame(obs: dict) -> np.ndarray:
    return np.asarray(obs["main_images"][0].cpu()).copy()


def run(args) -> dict:
    import torch
    from rlinf.envs.maniskill.maniskill_env import ManiskillEnv

    cfg = compose_env_config(args)
    env = ManiskillEnv(cfg, num_envs=1, seed_offset=0, total_num_processes=1, worker_info=None)
    obs, _ = env.reset()
    episodes = [[frame(obs)]]
    rewards, terminations, truncations, infos_at_done = [], [], [], []
    for t in range(1, args.steps + 1):
        if t == args.goal_step:
            move_goal_onto_cube(env)
        elif infos_at_done:  # episode 2 and later: the goal out of reach, so they truncate
            move_goal_onto_cube(env, height=0.25)
        actions = torch.zeros((1, 1, env.env.action_space.shape[-1]))
        obs_list, chunk_rewards, chunk_terms, chunk_truncs, infos_list = env.chunk_step(actions)
        infos = infos_list[-1]
        rewards.append(float(chunk_rewards[0, -1]))
        terminations.append(bool(chunk_terms[0, -1]))
        truncations.append(bool(chunk_truncs[0, -1]))
        if "final_info" in infos:  # the episode ended and the env reset itself (RLinf's auto reset)
            final = infos["final_info"]
            episodes[-1].append(frame(infos["final_observation"]))  # the done step's frame
            infos_at_done.append(
                {
                    "step": t,
                    "success": bool(final["success"][0]),
                    "episode": {k: np.asarray(v.cpu()).tolist() for k, v in final["episode"].items()},
                }
            )
            episodes.append([])
        episodes[-1].append(frame(obs_list[-1]))  # after a reset: the new episode's first frame
    result = {
        "rewards": rewards,
        "terminations": terminations,
        "truncations": truncations,
        "done": infos_at_done,
        "reward_coef": float(cfg.reward_coef),
        "task": None,
        "patched": hasattr(env, "vlm_reward"),
    }
    if getattr(env, "vlm_reward", None) is not None:
        result["counts"] = env.vlm_reward.counts
        result["task"] = env.vlm_reward.tasks()[0]
    np.savez(args.out + ".frames.npz", **{f"episode{i}": np.stack(f) for i, f in enumerate(episodes) if f})
    env.env.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rlinf-dir", required=True, help="RLinf source tree to import (patched or not)")
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--run", default="runB_qwen")
    parser.add_argument("--out", required=True)
    parser.add_argument("--url", default="http://127.0.0.1:18080")
    parser.add_argument("--reward", default="True")
    parser.add_argument("--reward-coef", type=float, default=2.0)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--nframes", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=10, help="the time limit (truncation)")
    parser.add_argument("--steps", type=int, default=16, help="steps driven in all")
    parser.add_argument("--goal-step", type=int, default=4)
    parser.add_argument("--fail-on-request-error", default="True")
    parser.add_argument("--fallback", default="zero")
    parser.add_argument("--wait-ready-s", type=float, default=60)
    parser.add_argument("--deadline-s", type=float, default=120)
    args = parser.parse_args()
    sys.path.insert(0, args.rlinf_dir)  # the tree shadows the installed rlinf, as run_embodiment.sh's PYTHONPATH does
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with open(args.out, "w") as f:
        json.dump(run(args), f)


if __name__ == "__main__":
    main()
