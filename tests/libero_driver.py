"""Drives RLinf's real (patched) LiberoEnv inside the simulator's own Python environment.

Run by tests/test_rlinf_integration.py with the LIBERO environment's interpreter (the
simulator stack pins numpy<2, the reward server's does not); prints one JSON object.

    python tests/libero_driver.py SCENARIO --rlinf-dir DIR --config-dir DIR --out FILE [--url URL] ...

Scenarios:
  sim    real LIBERO-10 simulation, 2 envs on task 0, short episodes through chunk_step;
         env 0 succeeds (its simulator state is set to the goal), env 1 truncates.
  many   64 envs whose simulator is a scripted stand-in (64 real LIBERO envs need ~170 GB
         here); every env ends in the same step.
  dense  real LIBERO-10 simulation as `sim`, each episode judged as a progress curve, stepped as
         RLinf's env worker steps it: RLinf's own rollout buffer (EmbodiedRolloutResult) keeps
         each chunk's rewards and the patched EnvWorker.place_vlm_rewards runs after every chunk
         step; reports the rewards of the trajectory that goes to the actor (--async-judge: with
         asynchronous judging).
  audit  real LIBERO-10 simulation, --envs envs on task 0 for --epochs rollout epochs as RLinf's
         env worker runs them (reset of every env, chunk steps, infos["episode"] read at the last
         chunk step, RLinf's own reduction of what it read); in epoch k env k succeeds. Every
         request body sent and every answer is recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

# Run as a script, this file's folder (tests/) is first on sys.path, where tests/libero/ (the LIBERO
# test tier's package) would shadow the simulator's own `libero` package: drop that folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]

from reward_tools.libero_sim import compose_env_config, goal_state  # noqa: E402  (after the path fix)


def reward_overrides(args, task0: bool) -> list[str]:
    rm = "env.train.reward_model"
    out = [
        "env.train.group_size=1",
        f"env.train.max_episode_steps={args.max_steps}",
        f"{rm}.enable={args.reward}",
        f"{rm}.url={args.url}",
        f"{rm}.fail_on_request_error={args.fail_on_request_error}",
        f"{rm}.fallback={args.fallback}",
        f"{rm}.wait_ready_s={args.wait_ready_s}",
        f"{rm}.deadline_s={args.deadline_s}",
        f"{rm}.timeout_s={min(args.deadline_s, 300)}",
        f"{rm}.async={args.async_judge}",  # the scenarios but `dense` read rewards from the env itself
    ]
    if task0:
        out.append("+env.train.task_id_filter=[0]")
    if args.score_mode:
        out.append(f"{rm}.score_mode={args.score_mode}")
    if args.video_dir:
        out += [f"{rm}.transport=video_path", f"+{rm}.video_dir={args.video_dir}", f"+{rm}.keep_videos=True"]
    if args.audit is not None:
        out.append(f"{rm}.audit={args.audit}")
    if args.canary_fraction is not None:
        out.append(f"{rm}.canary_fraction={args.canary_fraction}")
    if args.canary_tasks:
        out.append(f"+{rm}.canary_tasks={json.dumps(args.canary_tasks)}")
    if args.views:
        out.append(f"++{rm}.views=[{','.join(args.views)}]")
    return out


# --- the real simulator -------------------------------------------------------------------


def run_sim(args) -> dict:
    from rlinf.envs.libero.libero_env import LiberoEnv

    cfg = compose_env_config(args.config_dir, args.run, reward_overrides(args, task0=True))
    env = LiberoEnv(cfg, num_envs=2, seed_offset=0, total_num_processes=1, worker_info=None)
    obs, _ = env.reset()
    frames = [np.asarray(obs["main_images"]).copy()]
    rewards, terminations, truncations = [], [], []
    chunk = 4
    infos = None
    for k in range(args.max_steps // chunk):
        if k == args.goal_chunk:
            env.env.set_init_state(init_state=[goal_state(env, 0)], id=[0])
        actions = np.zeros((2, chunk, 7))
        actions[1, :, 0] = 0.3 * np.sin(np.arange(chunk) + k)  # env 1 moves its arm, never succeeds
        obs_list, chunk_rewards, chunk_terms, chunk_truncs, infos_list = env.chunk_step(actions)
        for o in obs_list:
            frames.append(np.asarray(o["main_images"]).copy())
        rewards.append(np.asarray(chunk_rewards))
        terminations.append(np.asarray(chunk_terms))
        truncations.append(np.asarray(chunk_truncs))
        infos = infos_list[-1]
    result = {
        "rewards": np.concatenate(rewards, axis=1).tolist(),
        "terminations": np.concatenate(terminations, axis=1).astype(int).tolist(),
        "truncations": np.concatenate(truncations, axis=1).astype(int).tolist(),
        "episode": {k: np.asarray(v).tolist() for k, v in infos["episode"].items()},
        "task_descriptions": list(env.task_descriptions),
        "reward_coef": float(cfg.reward_coef),
        "patched": hasattr(env, "vlm_reward"),
    }
    if getattr(env, "vlm_reward", None) is not None:
        hook = env.vlm_reward
        result["counts"] = hook.counts
        result["sent_steps"] = [hook.buffers._buffers[e].steps() for e in range(2)]
    np.save(args.out + ".frames.npy", np.stack(frames, axis=1))  # [env, step, H, W, 3]
    env.env.close()
    return result


def run_dense(args) -> dict:
    from types import SimpleNamespace

    from rlinf.data.embodied_io_struct import ChunkStepResult, EmbodiedRolloutResult
    from rlinf.envs.libero.libero_env import LiberoEnv
    from rlinf.workers.env.env_worker import EnvWorker

    overrides = reward_overrides(args, task0=True)
    if args.progress_points is not None:
        overrides.append(f"++env.train.reward_model.progress_points={args.progress_points}")
    cfg = compose_env_config(args.config_dir, args.run, overrides)
    env = LiberoEnv(cfg, num_envs=2, seed_offset=0, total_num_processes=1, worker_info=None)
    rollout = EmbodiedRolloutResult(max_episode_length=args.max_steps)
    chunks = args.max_steps // 4
    # what place_vlm_rewards reads of the worker
    worker = SimpleNamespace(env_list=[env], rollout_results=[rollout], n_train_chunk_steps=chunks)
    env.is_start = True  # RLinf's bootstrap_step: every rollout epoch starts with a reset
    env.reset()
    chunk, previous, emitted = 4, None, []
    for k in range(chunks):
        if previous is not None:  # the worker appends a chunk's rewards at the next chunk step (cloned)
            rollout.append_step_result(ChunkStepResult(rewards=previous.clone()))
        if k == args.goal_chunk:
            env.env.set_init_state(init_state=[goal_state(env, 0)], id=[0])
        actions = np.zeros((2, chunk, 7))
        actions[1, :, 0] = 0.3 * np.sin(np.arange(chunk) + k)
        _, chunk_rewards, chunk_terms, chunk_truncs, infos_list = env.chunk_step(actions)
        emitted.append(np.asarray(chunk_rewards).copy())
        # env_interact_step's env_info (no auto reset: the episode metrics of every env)
        env_info = {key: value.cpu() for key, value in infos_list[-1]["episode"].items()}
        dones = SimpleNamespace(rewards=chunk_rewards, dones=chunk_terms | chunk_truncs)
        EnvWorker.place_vlm_rewards(worker, 0, dones, k, env_info)
        previous = chunk_rewards
    rollout.append_step_result(ChunkStepResult(rewards=previous.clone()))  # the epoch's last append
    trained = rollout.to_trajectory().rewards  # [chunks, envs, actions per chunk]
    hook = env.vlm_reward
    result = {
        "trained": trained.permute(1, 0, 2).reshape(2, -1).tolist(),
        "emitted": np.concatenate(emitted, axis=1).tolist(),
        "episode": {k: np.asarray(v).tolist() for k, v in env_info.items()},  # as the worker records it
        "curves": [hook.curves.get(e) for e in range(2)],
        "sent_steps": [hook.buffers.steps(e) for e in range(2)],
        "placed": hook.placed,
        "counts": hook.counts,
        "reward_coef": float(cfg.reward_coef),
        "nframes": hook.config.nframes,
    }
    env.env.close()
    return result


# --- rollout epochs with the audit and canaries --------------------------------------------


class WireLog:
    """Every /score/batch body the hook's HTTP client sends and every answer, via httpx's own
    event hooks: what travelled (raw batch or JSON), not what the hook meant to send."""

    def __init__(self, client):
        self.batches: list[dict] = []
        self.epoch = 0
        client._http.event_hooks = {"request": [self.request], "response": [self.response]}

    def request(self, request) -> None:
        if not request.url.path.endswith("/score/batch"):
            return
        import base64

        from reward_protocol import raw_batch

        request.read()  # a streamed body is read here and then sent as these same bytes
        items = []
        if request.headers["content-type"].startswith(raw_batch.CONTENT_TYPE):
            header, payload = raw_batch.decode(request.content)
            for req in header.requests:
                frames = np.array(raw_batch.frames_view(req.frames, payload))
                items.append({"task": req.task_text, "request_id": req.request_id, "frames": frames})
        else:
            for req in json.loads(request.content)["requests"]:
                raw = base64.b64decode(req["frames"]["data_b64"])
                frames = np.frombuffer(raw, dtype=np.uint8).reshape(req["frames"]["shape"])
                items.append({"task": req["task_text"], "request_id": req.get("request_id"), "frames": frames})
        self.batches.append({"epoch": self.epoch, "items": items, "answer": None})

    def response(self, response) -> None:
        if response.request.url.path.endswith("/score/batch"):
            response.read()
            self.batches[-1]["answer"] = response.json()

    def dump(self, path: str) -> list[dict]:
        """Frames to path (npz), the rest as JSON-ready dicts."""
        arrays, out = {}, []
        for b, batch in enumerate(self.batches):
            items = []
            for i, (req, res) in enumerate(zip(batch["items"], batch["answer"]["results"], strict=True)):
                key = f"b{b}_i{i}"
                arrays[key] = req["frames"]
                score = (res.get("response") or {}).get("score")
                items.append({"frames": key, "task": req["task"], "request_id": req["request_id"], "score": score})
            out.append({"epoch": batch["epoch"], "items": items})
        np.savez(path, **arrays)
        return out


def run_audit(args) -> dict:
    import torch
    from rlinf.envs.libero.libero_env import LiberoEnv
    from rlinf.utils.metric_utils import compute_evaluate_metrics

    n, chunk = args.envs, 4
    cfg = compose_env_config(args.config_dir, args.run, reward_overrides(args, task0=True))
    env = LiberoEnv(cfg, num_envs=n, seed_offset=0, total_num_processes=1, worker_info=None)
    hook = env.vlm_reward
    wire = WireLog(hook.client)
    env_metrics: dict[str, list] = {}
    epochs, frames = [], []
    for epoch in range(args.epochs):
        wire.epoch, winner = epoch, epoch % n
        env.is_start = True  # as RLinf's bootstrap_step, at the start of every rollout epoch
        obs, _ = env.reset()
        seen = [np.asarray(obs["main_images"]).copy()]
        rewards, terms = [], []
        for k in range(args.max_steps // chunk):
            if k == args.goal_chunk:
                env.env.set_init_state(init_state=[goal_state(env, winner)], id=[winner])
            actions = np.zeros((n, chunk, 7))
            for e in range(n):
                if e != winner:  # the others move their arm and never succeed
                    actions[e, :, 0] = 0.3 * np.sin(np.arange(chunk) + k + e)
            obs_list, chunk_rewards, chunk_terms, _, infos_list = env.chunk_step(actions)
            seen += [np.asarray(o["main_images"]).copy() for o in obs_list]
            rewards.append(np.asarray(chunk_rewards))
            terms.append(np.asarray(chunk_terms))
        last = infos_list[-1]["episode"]  # what RLinf's env worker reads at the last chunk step
        for key, value in last.items():
            env_metrics.setdefault(key, []).append(value.cpu())
        epochs.append(
            {
                "rewards": np.concatenate(rewards, axis=1).tolist(),
                "terminations": np.concatenate(terms, axis=1).astype(int).tolist(),
                "episode": {k: np.asarray(v).tolist() for k, v in last.items()},
                "sent_steps": [hook.buffers._buffers[e].steps() for e in range(n)],
                "task_ids": np.asarray(env.task_ids).tolist(),
                "task_descriptions": list(env.task_descriptions),
            }
        )
        frames.append(np.stack(seen, axis=1))  # [env, step, H, W, 3]
        env.update_reset_state_ids()  # as RLinf's finish_rollout
    logged = compute_evaluate_metrics([{k: torch.cat(v) for k, v in env_metrics.items()}])
    np.save(args.out + ".frames.npy", np.stack(frames))  # [epoch, env, step, H, W, 3]
    env.env.close()
    return {
        "epochs": epochs,
        "logged": {k: float(v) for k, v in logged.items()},
        "wire": wire.dump(args.out + ".wire.npz"),
        "counts": hook.counts,
        "reward_coef": float(cfg.reward_coef),
        "threshold": hook.config.success_threshold,
    }


# --- 64 envs on a scripted stand-in simulator --------------------------------------------


class ScriptedVectorEnv:
    """Stands in for RLinf's ReconfigureSubprocEnv of real LIBERO envs, which cannot run 64 at
    once here: observations are small synthetic frames, and every env ends at the step the
    LiberoEnv's max_episode_steps truncates it; envs in `succeed` report success then."""

    def __init__(self, num_envs: int, succeed: set[int], success_step: int, size: int = 32):
        self.num_envs, self.succeed, self.success_step, self.size = num_envs, succeed, success_step, size
        self.t = np.zeros(num_envs, dtype=int)
        self.step_calls = 0

    def _obs(self, i: int) -> dict:
        img = np.full((self.size, self.size, 3), (i * 3) % 256, dtype=np.uint8)
        img[:, : min(self.size, 4 + 4 * self.t[i])] = 200  # a bar that grows over the episode
        return {
            "agentview_image": img,
            "robot0_eye_in_hand_image": img,
            "robot0_eef_pos": np.zeros(3),
            "robot0_eef_quat": np.array([0.0, 0.0, 0.0, 1.0]),
            "robot0_gripper_qpos": np.zeros(2),
        }

    def _ids(self, id):
        return list(range(self.num_envs)) if id is None else [int(i) for i in np.atleast_1d(id)]

    def reconfigure_env_fns(self, env_fns, id=None):
        pass

    def seed(self, seed=None):
        pass

    def reset(self, id=None):
        for i in self._ids(id):
            self.t[i] = 0
        return [self._obs(i) for i in self._ids(id)]

    def set_init_state(self, init_state=None, id=None):
        return [self._obs(i) for i in self._ids(id)]

    def step(self, actions, id=None):
        ids = self._ids(id)
        if id is None:
            self.step_calls += 1
            self.t[ids] += 1
        done = np.array([self.step_calls >= self.success_step and i in self.succeed for i in ids])
        return [self._obs(i) for i in ids], np.zeros(len(ids)), done, [{} for _ in ids]

    def close(self):
        pass


def run_many(args) -> dict:
    from rlinf.envs.libero.libero_env import LiberoEnv

    num_envs = 64
    succeed = set(range(0, num_envs, 2))

    class StandInLiberoEnv(LiberoEnv):
        def _init_env(self):
            self.env = ScriptedVectorEnv(num_envs, succeed, success_step=args.max_steps)

    cfg = compose_env_config(args.config_dir, args.run, reward_overrides(args, task0=False))
    env = StandInLiberoEnv(cfg, num_envs=num_envs, seed_offset=0, total_num_processes=1, worker_info=None)
    env.reset()
    if args.ready_file:
        open(args.ready_file, "w").close()  # the test may now break the server mid-rollout
    rewards, error = [], None
    try:
        for _ in range(args.max_steps):
            time.sleep(args.step_sleep)
            _, reward, _, _, infos = env.step(np.zeros((num_envs, 7)), auto_reset=False)
            rewards.append(np.asarray(reward))
    except RuntimeError as exc:
        error = str(exc)
    hook = env.vlm_reward
    return {
        "error": error,
        "rewards": np.stack(rewards, axis=1).tolist() if rewards else [],
        "succeeded": sorted(succeed),
        "counts": hook.counts,
        "client_attempts": hook.client.attempts,
        "episode": {k: np.asarray(v).tolist() for k, v in infos["episode"].items()} if error is None else None,
        "reward_coef": float(cfg.reward_coef),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["sim", "many", "audit", "dense"])
    parser.add_argument("--rlinf-dir", required=True, help="RLinf source tree to import (patched or not)")
    parser.add_argument("--config-dir", required=True)
    parser.add_argument("--run", default="runB_qwen")
    parser.add_argument("--out", required=True)
    parser.add_argument("--url", default="http://127.0.0.1:18080")
    parser.add_argument("--reward", default="True")
    parser.add_argument("--video-dir", default=None)
    parser.add_argument("--max-steps", type=int, default=24)
    parser.add_argument("--goal-chunk", type=int, default=2)
    parser.add_argument("--fail-on-request-error", default="True")
    parser.add_argument("--fallback", default="zero")
    parser.add_argument("--score-mode", default=None)
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--wait-ready-s", type=float, default=60)
    parser.add_argument("--deadline-s", type=float, default=600)
    parser.add_argument("--envs", type=int, default=3, help="audit scenario")
    parser.add_argument("--epochs", type=int, default=2, help="audit scenario")
    parser.add_argument("--audit", default=None)
    parser.add_argument("--canary-fraction", default=None)
    parser.add_argument("--canary-tasks", nargs="*", default=None)
    parser.add_argument("--progress-points", type=int, default=None, help="dense scenario (default: the config's)")
    parser.add_argument("--views", nargs="*", default=None, help="reward_model.views (default: the config's)")
    parser.add_argument(
        "--async-judge", action="store_true", help="reward_model.async (dense only: the others read the env's rewards)"
    )
    args = parser.parse_args()
    # the checkout shadows any installed rlinf, as run_embodiment.sh's PYTHONPATH does
    sys.path.insert(0, args.rlinf_dir)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = {"sim": run_sim, "many": run_many, "audit": run_audit, "dense": run_dense}[args.scenario](args)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
