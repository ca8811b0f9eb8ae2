"""Throughput and latency of the reward server on a LIBERO-like workload.

    python -m reward_server.bench --launch "--config configs/server/cpu_tiny.yaml" --out bench.json
    python -m reward_server.bench --url http://127.0.0.1:18080 --n 1 8 64 --styles logprob gen256

Workload: episodes of 16 frames of 256x256 (max_pixels 200704, as LIBERO-10 runs send), the
Qwen progress prompt or its logprob variant. For each N, N episodes arrive together (N
concurrent requests, as N envs ending in one step) and, in the same run against the same server,
the same N episodes are sent one at a time (the earlier design's behaviour); the ratio of the two
is printed. Scoring styles: `logprob` (prefill only), `genK` (exactly K new tokens: random
weights need fixed output lengths; gen8 is Qwen-answer-like, gen256 PRIMO-reasoning-like).
Output: a table on stdout and a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from reward_client.protocol import BackendKwargs, InlineFrames, ScoreRequest

logger = logging.getLogger("reward_server.bench")

TASKS = (
    "put both the alphabet soup and the tomato sauce in the basket",
    "turn on the stove and put the moka pot on it",
    "put the black bowl in the bottom drawer of the cabinet and close it",
    "pick up the book and place it in the back compartment of the caddy",
)


@dataclass
class Result:
    style: str
    n: int
    mode: str  # "together" or "one_at_a_time"
    wall_s: float
    episodes_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    preprocess_ms: float = 0.0  # server-side means per episode, from the responses' timings
    queue_ms: float = 0.0
    engine_ms: float = 0.0


def episode(seed: int, frames: int = 16, size: int = 256) -> np.ndarray:
    """A LIBERO-sized episode: a textured table with a block moving across (not constant)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(60, 200, size=(size // 8, size // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    video = np.repeat(base[None], frames, axis=0)
    for t in range(frames):
        x = int((size - 40) * t / max(1, frames - 1))
        video[t, 100:140, x : x + 40] = (200, 30, 30)
    return video


def style_kwargs(style: str) -> BackendKwargs:
    if style == "logprob":
        return BackendKwargs(score_mode="logprob")
    if style.startswith("gen") and style[3:].isdigit():
        return BackendKwargs(max_tokens=int(style[3:]), ignore_eos=True, temperature=0.0)
    raise ValueError(f"unknown style {style!r}: logprob or genK (e.g. gen8, gen256)")


class Episodes:
    """Hands out episodes never sent before, so no measurement is helped by the engine's
    prefix or multimodal caches (every real episode is new)."""

    def __init__(self, frames: int, size: int):
        self.frames, self.size, self.next_seed = frames, size, 0

    def take(self, n: int) -> list[np.ndarray]:
        seeds = range(self.next_seed, self.next_seed + n)
        self.next_seed += n
        return [episode(seed, self.frames, self.size) for seed in seeds]


def bodies(videos: list[np.ndarray], style: str) -> list[dict]:
    """Request bodies, encoded outside the timing."""
    kwargs = style_kwargs(style)
    return [
        ScoreRequest(
            task_text=TASKS[i % len(TASKS)],
            frames=InlineFrames.from_array(video),
            nframes=len(video),
            backend_kwargs=kwargs,
        ).model_dump(mode="json", exclude_none=True)
        for i, video in enumerate(videos)
    ]


async def _send(client: httpx.AsyncClient, body: dict) -> tuple[float, dict | None]:
    started = time.perf_counter()
    response = await client.post("/score", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed, response.json()["timings"] if response.status_code == 200 else None


async def measure(url: str, style: str, n: int, together: bool, payload: list[dict]) -> Result:
    limits = httpx.Limits(max_connections=max(n, 1) + 4, max_keepalive_connections=max(n, 1) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=3600, limits=limits) as client:
        started = time.perf_counter()
        if together:
            outcomes = await asyncio.gather(*(_send(client, body) for body in payload))
        else:
            outcomes = [await _send(client, body) for body in payload]
        wall = time.perf_counter() - started
    latencies = sorted(ms for ms, _ in outcomes)
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    timings = [t for _, t in outcomes if t is not None] or [{}]
    mean = lambda key: statistics.fmean(t.get(key, 0.0) for t in timings)  # noqa: E731
    return Result(
        style=style,
        n=n,
        mode="together" if together else "one_at_a_time",
        wall_s=wall,
        episodes_per_s=n / wall,
        p50_ms=statistics.median(latencies),
        p99_ms=p99,
        errors=sum(t is None for _, t in outcomes),
        preprocess_ms=mean("preprocess_ms"),
        queue_ms=mean("queue_ms"),
        engine_ms=mean("engine_ms"),
    )


async def run(
    url: str, styles: list[str], ns: list[int], repeats: int, sequential: bool, frames: int, size: int
) -> list[Result]:
    results = []
    episodes = Episodes(frames, size)
    for style in styles:
        await measure(url, style, 4, True, bodies(episodes.take(4), style))  # warm-up: kernels, compile
        for n in ns:
            modes = [True, False] if sequential else [True]
            for together in modes:
                best = None
                for _ in range(repeats if together else 1):  # one-at-a-time is long and steady
                    r = await measure(url, style, n, together, bodies(episodes.take(n), style))
                    if best is None or r.wall_s < best.wall_s:
                        best = r
                results.append(best)
                logger.info("%s", best)
    return results


def table(results: list[Result]) -> str:
    lines = [
        f"{'style':<9} {'N':>4} {'mode':<14} {'eps/s':>8} {'wall s':>8} {'p50 ms':>9} {'p99 ms':>9} {'err':>4}"
        f" {'prep ms':>8} {'queue ms':>9} {'engine ms':>10}"
    ]
    for r in results:
        lines.append(
            f"{r.style:<9} {r.n:>4} {r.mode:<14} {r.episodes_per_s:>8.2f} {r.wall_s:>8.2f} "
            f"{r.p50_ms:>9.0f} {r.p99_ms:>9.0f} {r.errors:>4} {r.preprocess_ms:>8.1f} {r.queue_ms:>9.1f}"
            f" {r.engine_ms:>10.1f}"
        )
    return "\n".join(lines)


def ratios(results: list[Result]) -> dict[str, float]:
    """Batched vs one-at-a-time speed-up, measured in this run, per (style, N)."""
    out = {}
    for r in results:
        if r.mode != "together":
            continue
        for s in results:
            if s.mode == "one_at_a_time" and (s.style, s.n) == (r.style, r.n):
                out[f"{r.style}@{r.n}"] = s.wall_s / r.wall_s
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_server.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server")
    target.add_argument("--launch", help="start a server with these flags (quoted), measure, stop it")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--styles", nargs="+", default=["logprob", "gen8"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-sequential", action="store_true", help="skip the one-at-a-time runs")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--startup-timeout", type=float, default=900)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    server = None
    url = args.url
    if args.launch is not None:
        from reward_server.launch import ServerProcess

        server = ServerProcess(shlex.split(args.launch), log_path=Path(args.out).with_suffix(".server.log"))
        server.start()
        server.wait_ready(args.startup_timeout)
        url = server.url
    try:
        health = httpx.get(f"{url}/health", timeout=10).json()
        results = asyncio.run(
            run(url, args.styles, args.n, args.repeats, not args.no_sequential, args.frames, args.size)
        )
        stats = httpx.get(f"{url}/stats", timeout=10).json()
    finally:
        if server is not None:
            server.stop()
    speedups = ratios(results)
    report = {
        "server": health,
        "launch": args.launch,
        "engine_stats": stats,
        "workload": {"frames": args.frames, "size": args.size, "max_pixels": 200704},
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "results": [asdict(r) for r in results],
        "batched_vs_one_at_a_time": speedups,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(table(results))
    for key, value in speedups.items():
        print(f"batched vs one-at-a-time, {key}: {value:.1f}x (same run, same server)")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
