#!/usr/bin/env python3
"""Env-side cost of the VLM reward: CPU per finished episode and memory per env.

    python -m reward_tools.benchmarks.client [--envs 64] [--steps 512] [--nframes 16] [--size 256]

Runs the client's episode buffers over an episode of --steps frames for --envs envs (frames as
LIBERO renders them, 256x256 RGB), then, for each transport the hook offers, builds every env's
request as the hook does (frame selection, encoding) and sends it over HTTP to a local sink that
reads the body and answers at once (a separate process: its CPU is not counted). Prints the
env process's CPU milliseconds per step and per finished episode, the request bytes, and the
buffer memory per env next to the resident-memory growth.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import textwrap
import time

import numpy as np

from reward_client.client import _Body, _json_batch, _raw_batch
from reward_client.rlinf.episodes import EpisodeBuffers
from reward_protocol.score import InlineFrames, ScoreOptions, ScoreRequest

SINK = textwrap.dedent(
    """
    import sys, uvicorn
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


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

    options = ScoreOptions(task_text="put the bowl on the plate", nframes=args.nframes)

    def raw() -> _Body:
        return _raw_batch([(options, buffers.frames(e)) for e in range(args.envs)])

    def inline() -> _Body:
        return _json_batch(
            [
                ScoreRequest(**options.model_dump(), frames=InlineFrames.from_array(buffers.frames(e)))
                for e in range(args.envs)
            ]
        )

    import httpx

    from reward_tools.launch import free_port

    port = free_port()
    sink = subprocess.Popen([sys.executable, "-c", SINK, str(port)])
    frame_bytes = args.size * args.size * 3
    report = {
        "envs": args.envs,
        "steps": args.steps,
        "nframes": args.nframes,
        "cpu_ms_per_env_step": 1000 * cpu_steps / (args.envs * (args.steps - 1)),
        "buffer_frames_per_env": buffers.nbytes / args.envs / frame_bytes,
        "buffer_mib_per_env": buffers.nbytes / args.envs / 2**20,
        "rss_growth_mib_per_env": (rss_after_episode - rss_before) / args.envs,
    }
    try:
        with httpx.Client(timeout=60) as client:
            for _ in range(100):  # the sink starts
                try:
                    client.get(f"http://127.0.0.1:{port}/")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            for name, build in (("raw", raw), ("inline", inline)):
                best = None
                for _ in range(3):
                    cpu = time.process_time()
                    body = build()
                    encoded = time.process_time() - cpu
                    response = client.post(f"http://127.0.0.1:{port}/", content=body.stream(), headers=body.headers())
                    response.raise_for_status()
                    total = time.process_time() - cpu
                    best = (encoded, total) if best is None or total < best[1] else best
                report[f"{name}_cpu_ms_per_finished_episode"] = 1000 * best[1] / args.envs
                report[f"{name}_encode_cpu_ms_per_finished_episode"] = 1000 * best[0] / args.envs
                report[f"{name}_batch_body_mib"] = body.length / 2**20
    finally:
        sink.terminate()
        sink.wait(10)
    for key, value in report.items():
        print(f"{key:<30} {value:.3f}" if isinstance(value, float) else f"{key:<30} {value}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
