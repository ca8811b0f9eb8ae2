"""RLinf main's reward-model workflow around reward_tools.label_episodes, in the simulator's own
Python environment (run by tests/test_reward_model_workflow.py; prints nothing, writes JSON).

    python tests/reward_model_driver.py collect --rlinf-dir DIR --save-dir DIR --out FILE
    python tests/reward_model_driver.py compare --rlinf-dir DIR --episodes DIR --out FILE

collect: RLinf main's own ManiskillEnv (PickCube-v1, CPU physics, SAPIEN on lavapipe, config
`maniskill_ppo_mlp_resnet_reward` from its examples) wrapped in its own `CollectEpisode`, exactly
as its env worker wraps it with `env.train.data_collection` enabled, stepped through `chunk_step`
with auto reset; odd episodes succeed (the goal site is moved onto the resting cube), even ones
run into the time limit with the goal out of reach. The wrapper writes the pickles.
compare: RLinf's own examples/reward/preprocess_reward_dataset.py and reward_tools' reader and
writer on the same pickles with the simulator's labels: the datasets must be identical.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def env_config(rlinf_dir: str, size: int, max_steps: int):
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(rlinf_dir, "examples", "embodiment", "config")
    os.environ.setdefault("EMBODIED_PATH", os.path.dirname(config_dir))
    overrides = [
        "env.train.init_params.sim_backend=cpu",
        "+env.train.init_params.render_backend=cpu",  # the Vulkan device is the CPU (lavapipe)
        f"env.train.init_params.sensor_configs.width={size}",
        f"env.train.init_params.sensor_configs.height={size}",
        f"env.train.max_episode_steps={max_steps}",
        "env.train.total_num_envs=1",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base="1.1"):
        cfg = compose(config_name="maniskill_ppo_mlp_resnet_reward", overrides=overrides)
    return cfg.env.train


def collect(args) -> dict:
    import torch
    from rlinf.envs.maniskill.maniskill_env import ManiskillEnv
    from rlinf.envs.wrappers import CollectEpisode

    from tests.maniskill_driver import move_goal_onto_cube  # PickCube's success made, or kept out of reach

    cfg = env_config(args.rlinf_dir, args.size, args.max_steps)
    base = ManiskillEnv(cfg, num_envs=1, seed_offset=0, total_num_processes=1, worker_info=None)
    env = CollectEpisode(base, save_dir=args.save_dir, rank=0, num_envs=1, export_format="pickle")
    env.reset()
    episode, step_in_episode, done = 0, 0, []
    started = time.perf_counter()
    while len(done) < args.episodes_n:
        step_in_episode += 1
        success_episode = episode % 2 == 0
        if success_episode and step_in_episode == args.goal_step:
            move_goal_onto_cube(base)
        elif not success_episode and step_in_episode == 1:
            move_goal_onto_cube(base, height=0.25)
        actions = torch.zeros((1, 1, base.env.action_space.shape[-1]))
        _, _, terms, truncs, infos_list = env.chunk_step(actions)
        if bool(terms[0, -1]) or bool(truncs[0, -1]):
            final = infos_list[-1].get("final_info", {})
            done.append({"steps": step_in_episode, "success": bool(np.asarray(final.get("success", [False])[0]))})
            episode, step_in_episode = episode + 1, 0
    env.close()
    return {"episodes": done, "seconds": time.perf_counter() - started, "files": sorted(os.listdir(args.save_dir))}


def compare(args) -> dict:
    """RLinf's preprocessing and the tool's reader + writer, both on the simulator's labels."""
    import torch

    sys.path.insert(0, os.path.join(args.rlinf_dir, "examples", "reward"))
    import preprocess_reward_dataset as rlinf_pre

    from reward_tools.episode_files import find_episodes, read_episode
    from reward_tools.reward_datasets import SplitOptions, sample_indices, write_rlinf_splits

    out = Path(args.out).parent
    results = {}
    for samples, seed in ((0, 42), (3, 7)):
        theirs, ours = out / f"rlinf_{samples}", out / f"ours_{samples}"
        rlinf_pre.preprocess_and_save_reward_datasets(
            args.episodes, str(theirs / "train.pt"), str(theirs / "val.pt"), samples, True, 0.5, 2.0, seed
        )
        root = Path(args.episodes)
        form, paths = find_episodes(root)
        episodes = []
        for path in paths:
            ep = read_episode(form, path, root)
            keep = sample_indices(len(ep.frames), samples, True)
            episodes.append(([ep.frames[i] for i in keep], [int(ep.sim_labels[i]) for i in keep]))
        write_rlinf_splits(ours, episodes, SplitOptions(samples, True, 0.5, 2.0, seed), {})
        same = {}
        for split in ("train", "val"):
            a = torch.load(theirs / f"{split}.pt", weights_only=False)
            b = torch.load(ours / f"{split}.pt", weights_only=False)
            same[split] = {
                "count": len(a["images"]),
                "labels_equal": a["labels"] == b["labels"],
                "images_equal": len(a["images"]) == len(b["images"])
                and all(torch.equal(torch.as_tensor(x), y) for x, y in zip(a["images"], b["images"], strict=True)),
                "success": sum(a["labels"]),
            }
        results[f"samples_{samples}_seed_{seed}"] = same
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["collect", "compare"])
    parser.add_argument("--rlinf-dir", required=True, help="RLinf main source tree (shadows the installed rlinf)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-dir", help="collect: where CollectEpisode writes")
    parser.add_argument("--episodes", help="compare: the collected pickles")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--goal-step", type=int, default=4)
    parser.add_argument("--episodes-count", dest="episodes_n", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, args.rlinf_dir)
    sys.path.insert(1, str(REPO))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = {"collect": collect, "compare": compare}[args.command](args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
