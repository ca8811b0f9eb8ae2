#!/usr/bin/env python3
"""What canary probes cost: the RLinf hook with and without them, side by side, one run, one server.

    python -m reward_tools.benchmarks.canary --launch "--config configs/server/cpu_tiny.yaml --engine hf" \\
        [--envs 64] [--fraction 0.1] [--rounds 3] --out docs/bench/cpu_canary.json
    python -m reward_tools.benchmarks.canary --url http://127.0.0.1:18080 ...

Two hooks (VLMRewardHook, as inside LiberoEnv, 256x256 frames) drive the same synthetic rollout
epochs against the same server: a few envs succeed one by one (one small batch each), then every
other env truncates in the same step (one batch of the rest, as LIBERO-10's failing envs do at
step 512). Rounds alternate which hook goes first (ABBA), so drift on a shared machine falls on
both. Reported per hook: judged items per real episode, wall time of each judged step (the
`on_step` call: requests, HTTP, scoring, bookkeeping) and the env process's CPU time in it;
then the ratios with / without canaries.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.hook import VLMRewardHook

TASKS = (  # four LIBERO-10 instructions, so wrong_task probes have others to draw from
    "put both the alphabet soup and the tomato sauce in the basket",
    "turn on the stove and put the moka pot on it",
    "put the black bowl in the bottom drawer of the cabinet and close it",
    "pick up the book and place it in the back compartment of the caddy",
)


def frames(step: int, envs: int, size: int) -> np.ndarray:
    """A textured scene per env with a block that moves over the episode."""
    rng = np.random.default_rng(step)
    out = rng.integers(0, 80, size=(envs, size, size, 3), dtype=np.uint8)
    x = (7 * step) % (size - 24)
    out[:, 40:64, x : x + 24] = (200, 60, 40)
    return out


def epoch(hook: VLMRewardHook, steps: int, successes: int, size: int) -> list[dict]:
    """One rollout epoch; envs 0..successes-1 succeed at steps 2, 3, ...; the rest truncate at `steps`."""
    n = hook.num_envs
    tasks = [TASKS[e % len(TASKS)] for e in range(n)]
    hook.on_reset(None, frames(0, n, size))
    judged = []
    for t in range(1, steps + 1):
        terms = np.array([e < successes and t >= 2 + e for e in range(n)])
        truncs = np.full(n, t >= steps)
        before = {k: hook.counts[k] for k in ("episodes", "canaries")}
        wall, cpu = time.perf_counter(), time.process_time()
        hook.on_step(frames(t, n, size), tasks, terms, truncs, task_ids=[e % len(TASKS) for e in range(n)])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        real = hook.counts["episodes"] - before["episodes"]
        if real:
            judged.append(
                {"real": real, "canaries": hook.counts["canaries"] - before["canaries"], "wall_s": wall, "cpu_s": cpu}
            )
    return judged


def summarize(steps: list[dict], rounds: int) -> dict:
    big = [s for s in steps if s["real"] > 1]  # the step where the failing envs truncate together
    small = [s for s in steps if s["real"] == 1]
    real, canaries = sum(s["real"] for s in steps), sum(s["canaries"] for s in steps)
    return {
        "judged_steps": len(steps),
        "real_episodes": real,
        "canary_items": canaries,
        "items_per_real_episode": (real + canaries) / real,
        "truncation_step_wall_s": statistics.median(s["wall_s"] for s in big),
        "truncation_step_wall_s_each": [round(s["wall_s"], 3) for s in big],  # in round order
        "truncation_step_canaries": statistics.mean(s["canaries"] for s in big),
        "single_episode_step_wall_s": statistics.median(s["wall_s"] for s in small) if small else None,
        "judge_wall_s_per_epoch": sum(s["wall_s"] for s in steps) / rounds,
        "env_cpu_s_per_epoch": sum(s["cpu_s"] for s in steps) / rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server")
    target.add_argument("--launch", help="start a server with these flags (quoted), measure, stop it")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3, help="rollout epochs per hook")
    parser.add_argument("--steps", type=int, default=12, help="steps per epoch (all envs done at the last)")
    parser.add_argument("--successes", type=int, default=6, help="envs that succeed, one per step, before the end")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--nframes", type=int, default=16)
    parser.add_argument("--score-mode", default="logprob")
    parser.add_argument("--out", default="bench_canary.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    server = None
    url = args.url
    if args.launch is not None:
        from reward_tools.launch import ServerProcess

        server = ServerProcess(shlex.split(args.launch), log_path=Path(args.out).with_suffix(".server.log"))
        server.start()
        server.wait_ready(900)
        url = server.url
    try:
        common = dict(enable=True, url=url, nframes=args.nframes, score_mode=args.score_mode, wait_ready_s=60)
        hooks = {
            "without": VLMRewardHook(RewardModelConfig(**common, canary_fraction=0.0), args.envs),
            "with": VLMRewardHook(RewardModelConfig(**common, canary_fraction=args.fraction), args.envs),
        }
        epoch(hooks["without"], 3, 0, args.size)  # warm-up: first requests pay one-off costs
        steps: dict[str, list[dict]] = {name: [] for name in hooks}
        for r in range(args.rounds):
            order = ["without", "with"] if r % 2 == 0 else ["with", "without"]
            for name in order:
                steps[name] += epoch(hooks[name], args.steps, args.successes, args.size)
                print(f"round {r + 1}/{args.rounds}: {name} canaries done", file=sys.stderr)
    finally:
        if server is not None:
            server.stop()

    results = {name: summarize(s, args.rounds) for name, s in steps.items()}
    w, wo = results["with"], results["without"]
    ratios = {
        "extra_items_per_real_episode": w["items_per_real_episode"] - 1,
        "truncation_step_wall": w["truncation_step_wall_s"] / wo["truncation_step_wall_s"],
        "truncation_step_added_s": w["truncation_step_wall_s"] - wo["truncation_step_wall_s"],
        "judge_wall_per_epoch": w["judge_wall_s_per_epoch"] / wo["judge_wall_s_per_epoch"],
        "env_cpu_per_epoch": w["env_cpu_s_per_epoch"] / wo["env_cpu_s_per_epoch"],
    }
    if w["single_episode_step_wall_s"] and wo["single_episode_step_wall_s"]:
        ratios["single_episode_step_wall"] = w["single_episode_step_wall_s"] / wo["single_episode_step_wall_s"]
    report = {
        "server": {"launch": args.launch} if args.launch else {"url": "given"},
        "workload": {k: getattr(args, k) for k in ("envs", "fraction", "rounds", "steps", "successes", "size")}
        | {"nframes": args.nframes, "score_mode": args.score_mode, "canary_kinds": 3},
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "without_canaries": wo,
        "with_canaries": w,
        "with_vs_without": ratios,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    for name, res in (("without canaries", wo), (f"canary_fraction {args.fraction}", w)):
        print(
            f"{name:<22} items/real episode {res['items_per_real_episode']:.3f}  "
            f"truncation step ({args.envs - args.successes} envs) {res['truncation_step_wall_s']:.2f} s  "
            f"judge wall/epoch {res['judge_wall_s_per_epoch']:.2f} s  env CPU/epoch {res['env_cpu_s_per_epoch']:.2f} s"
        )
    print("with / without: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
