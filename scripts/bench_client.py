#!/usr/bin/env python3
"""Env-side cost of the VLM reward: CPU per finished episode and memory per env.

    python scripts/bench_client.py [--envs 64] [--steps 512] [--nframes 16] [--size 256]

Runs the client's episode buffers over an episode of --steps frames for --envs envs (frames as
LIBERO renders them, 256x256 RGB), then builds every env's request as the RLinf hook does
(frame selection, inline encoding, the JSON body). Prints CPU milliseconds per step and per
finished episode (no HTTP), and the buffer memory per env next to the resident-memory growth.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from reward_client.client import _dumps
from reward_client.episodes import EpisodeBuffers
from reward_client.protocol import BatchScoreRequest, InlineFrames, ScoreRequest


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--nframes", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(8, args.envs, args.size, args.size, 3), dtype=np.uint8)
    rss_before = rss_mib()
    buffers = EpisodeBuffers(args.envs, args.nframes)
    active = np.ones(args.envs, dtype=bool)
    cpu0 = time.process_time()
    buffers.start(range(args.envs), frames[0])
    for t in range(1, args.steps):
        buffers.append(frames[t % 8], active)
    cpu_steps = time.process_time() - cpu0
    rss_after_episode = rss_mib()

    cpu1 = time.process_time()
    requests = [
        ScoreRequest(
            task_text="put the bowl on the plate",
            frames=InlineFrames.from_array(buffers.frames(e)),
            nframes=args.nframes,
        )
        for e in range(args.envs)
    ]
    body = _dumps(BatchScoreRequest(requests=requests).model_dump(mode="json", exclude_none=True))
    cpu_requests = time.process_time() - cpu1

    frame_bytes = args.size * args.size * 3
    report = {
        "envs": args.envs,
        "steps": args.steps,
        "nframes": args.nframes,
        "cpu_ms_per_env_step": 1000 * cpu_steps / (args.envs * (args.steps - 1)),
        "cpu_ms_per_finished_episode": 1000 * cpu_requests / args.envs,
        "buffer_frames_per_env": buffers.nbytes / args.envs / frame_bytes,
        "buffer_mib_per_env": buffers.nbytes / args.envs / 2**20,
        "rss_growth_mib_per_env": (rss_after_episode - rss_before) / args.envs,
        "batch_body_mib": len(body) / 2**20,
    }
    for key, value in report.items():
        print(f"{key:<30} {value:.3f}" if isinstance(value, float) else f"{key:<30} {value}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
