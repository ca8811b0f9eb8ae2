"""Drives RLinf main's own API reward path (EmbodiedAPIRewardWorker) against this server.

Run by tests/test_rlinf_api_worker.py with the simulator environment's interpreter (RLinf's
dependencies: torch, transformers 4, Hydra, aiohttp) and RLinf main's checkout first on
PYTHONPATH; prints nothing, writes one JSON object to --out.

    python tests/rlinf_api_driver.py --rlinf-dir DIR --config FILE --model-path CKPT --out FILE
        --scenario NAME=URL [--scenario NAME=URL ...] [--envs N] [--steps S] [--layout libero|maniskill]

What runs is RLinf's: the run config composed by Hydra from RLinf main's own config groups,
`EmbodiedAPIRewardWorker.__init__` and `init_worker` (its processor, input builder
`vlm_trend_reward_input_builder`, parser `vlm_trend_reward_parser`, HTTP client
`InferenceHTTPClient`), its `compute_reward` (JPEG data URLs, one request per env from a
thread pool, the parse), and the env worker's `get_reward_model_output` body with RLinf's
`HistoryManager` (the windows, cleared when an env is done). Stood in, because they need a Ray
cluster or a GPU: `Worker.__init__` (a Ray actor's rank and world size: rank 0 of 1),
`HybridComponentPlacement` / `Cluster` (read only for placement), `torch.cuda.set_device` /
`current_device`; the env worker is built without its `__init__` (it starts the simulators) with
the attributes that method reads, and its channel to the reward worker (`send_to` / `recv_from`,
Ray channels) is a direct call to the reward worker's `compute_reward`, as the reward worker's own
loop makes it. The observations are synthetic frames shaped as each env emits them (LIBERO:
`main_images`, `wrist_images` [N, H, W, 3] uint8 and `task_descriptions`; ManiSkill's
PickCube3View: `main_images` and `extra_view_images` [N, 1, H, W, 3]); env i's frames have the
brightness BRIGHTNESS[i % 3], which the fake engine's `answer_words` turns into a label.

Scenarios (each NAME=URL: the server to call):
  windows   the config as written: --steps chunk steps; env 0 is done at step 6 (its window is
            cleared). Reports each step's rewards and the worker's request count per step.
  episode   input_on_done with an episode-sized window (history_size = input_interval = steps):
            reports the exception the worker raises on the first step no env ended.
  overload  one step with full windows against a server whose queue is shorter than the envs:
            reports the exception the worker raises (it does not retry).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

BRIGHTNESS = (250, 10, 128)  # env i % 3: positive, negative, unclear under answer_words
SIZE = 64
DONE_ENV, DONE_STEP = 0, 6


def compose(config: Path, rlinf_dir: Path, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    os.environ["EMBODIED_PATH"] = str(rlinf_dir / "examples" / "embodiment")
    with initialize_config_dir(config_dir=str(config.parent), version_base="1.1"):
        return hydra_compose(config_name=config.stem, overrides=overrides)


def build_reward_worker(cfg):
    """RLinf's EmbodiedAPIRewardWorker, its __init__ and init_worker run for real (stand-ins: the
    module's docstring)."""
    import torch
    from rlinf.scheduler import Worker
    from rlinf.workers.reward import reward_worker
    from rlinf.workers.reward.api_reward_worker import EmbodiedAPIRewardWorker

    def ray_free_init(self, *args, **kwargs):
        self._rank, self._world_size = 0, 1

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(Worker, "__init__", ray_free_init))
        stack.enter_context(mock.patch.object(reward_worker, "HybridComponentPlacement", lambda *a: None))
        stack.enter_context(mock.patch.object(reward_worker, "Cluster", lambda *a: None))
        stack.enter_context(mock.patch.object(torch.cuda, "set_device", lambda *a: None))
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: "cpu"))
        worker = EmbodiedAPIRewardWorker(cfg)
    worker.init_worker()
    count_calls(worker)
    return worker


class EnvSide:
    """RLinf's env worker, as far as its reward path goes: get_reward_model_output's own body."""

    def __init__(self, cfg, reward_worker, envs: int):
        from rlinf.utils.env_helpers.history_manager import HistoryManager
        from rlinf.workers.env.env_worker import EnvWorker

        self.worker = EnvWorker.__new__(EnvWorker)  # its __init__ starts simulators
        w = self.worker
        w.cfg = cfg
        w.reward_mode = cfg.reward.reward_mode
        w.env_infos_reward_keys = ("success", "episode", "final_info")
        w.train_history_managers = [HistoryManager(cfg.reward, envs)]
        w.history_lengths = [{}]
        w.train_num_envs_per_stage = envs
        w.train_batch_size = envs
        w.env_decoupled_mode = False
        self.requests: list[int] = []
        sent: dict = {}

        def send_to(**kwargs):
            sent["data"] = kwargs["data"]

        def recv_from(**kwargs):
            before = reward_worker.http_client_calls
            out = reward_worker.compute_reward(sent.pop("data"))
            self.requests.append(reward_worker.http_client_calls - before)
            return out

        w.send_to, w.recv_from = send_to, recv_from
        w._timer_metrics, w._accelerator_type = {}, None  # its profiling timer (Worker.timer): no accelerator

    def step(self, env_output):
        return self.worker.get_reward_model_output(env_output, None, None, stage_id=0)


def count_calls(worker) -> None:
    """Count the worker's HTTP calls (the requests it sends), through its own client."""
    worker.http_client_calls = 0
    post = worker.http_client.post

    def counted(*args, **kwargs):
        worker.http_client_calls += 1
        return post(*args, **kwargs)

    worker.http_client.post = counted


def observations(layout: str, envs: int, step: int) -> dict:
    import torch

    levels = torch.tensor([BRIGHTNESS[i % 3] for i in range(envs)], dtype=torch.uint8)
    frames = levels.view(envs, 1, 1, 1).expand(envs, SIZE, SIZE, 3).clone()
    frames[:, :8, : 4 * step] = 200  # the frames change along the window
    if layout == "libero":
        return {
            "main_images": frames,
            "wrist_images": frames.clone(),
            "states": torch.zeros(envs, 8),
            "task_descriptions": [f"put the bowl on the plate ({i})" for i in range(envs)],
        }
    return {"main_images": frames, "extra_view_images": frames.clone().unsqueeze(1), "states": torch.zeros(envs, 42)}


def env_output(layout: str, envs: int, step: int, done_envs: tuple[int, ...] = ()):
    import torch
    from rlinf.data.schema.embodied_types import EnvOutput

    dones = torch.zeros(envs, 8, dtype=torch.bool)
    for i in done_envs:
        dones[i, -1] = True
    return EnvOutput(obs=observations(layout, envs, step), dones=dones, rewards=torch.zeros(envs, 8))


def run_windows(cfg, args) -> dict:
    worker = build_reward_worker(cfg)
    env = EnvSide(cfg, worker, args.envs)
    steps = []
    for step in range(1, args.steps + 1):
        done = (DONE_ENV,) if step == DONE_STEP else ()
        rewards = env.step(env_output(args.layout, args.envs, step, done))
        steps.append({"step": step, "rewards": rewards.reshape(-1).tolist(), "requests": env.requests[-1]})
    return {
        "steps": steps,
        "model_name": worker.model_name,
        "video_keys": list(worker.input_builder.video_keys),
        "history_buffers": worker.history_buffer_names,
    }


def failure(exc: BaseException) -> dict:
    chain = []
    while exc is not None:
        chain.append(type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    return {"exception": chain, "message": str(traceback.format_exc())[-2000:]}


def first_failure(cfg, args, steps: int) -> dict:
    """Chunk steps until the reward path raises: the step and what it raised (RLinf's result)."""
    worker = build_reward_worker(cfg)
    env = EnvSide(cfg, worker, args.envs)
    for step in range(1, steps + 1):
        try:
            env.step(env_output(args.layout, args.envs, step))
        except BaseException as exc:
            return {"step": step, **failure(exc)}
    return {"step": None}


def run_episode(cfg, args) -> dict:
    return first_failure(cfg, args, args.steps)


def run_overload(cfg, args) -> dict:
    return first_failure(cfg, args, cfg.reward.model.history_buffers.history_window.history_size)


SCENARIOS = {"windows": run_windows, "episode": run_episode, "overload": run_overload}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rlinf-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--scenario", action="append", required=True, help="NAME=URL")
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--layout", choices=("libero", "maniskill"), default="libero")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    base = [
        f"reward.model.model_path={args.model_path}",
        f"reward.api.model={args.model_name}",
        f"env.train.total_num_envs={args.envs}",
    ]
    window = "reward.model.history_buffers.history_window"
    extra = {
        "windows": [],
        "overload": [],
        "episode": [
            f"{window}.history_size={args.steps}",
            f"{window}.min_history_size=1",
            f"{window}.input_interval={args.steps}",
            f"{window}.input_on_done=True",
        ],
    }
    result = {}
    for item in args.scenario:
        name, url = item.split("=", 1)
        cfg = compose(args.config, args.rlinf_dir, [*base, f"reward.api.api_base={url}/v1", *extra[name]])
        result[name] = SCENARIOS[name](cfg, args)
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
