"""What a progress curve costs: N episodes ending together, scored with K = 1, 8, 16 points on
the hook's path (one raw batch), against the same curves computed the plain way (each prefix
sent as its own episode, K x N items), in one run against one server. Prints JSON.

    python -m reward_tools.bench_curves --launch "--config configs/server/cpu_tiny.yaml" --n 16
    python -m reward_tools.bench_curves --url http://127.0.0.1:18080 --n 64 --points 1 8 16

Every measurement sends episodes never sent before (a random first seed per run), so only the
reuse inside one curve can hit the engine's prefix cache. Per row: wall seconds (the median of
--repeats, each on new episodes; `walls_s` lists them all), the ratio to K = 1 (`over_k1`), and
what the server's /stats counted during the median repeat: engine requests, prompt tokens, those
taken from the prefix cache (`cached_tokens`), vLLM's own prefix-cache lookups
(`prefix_cache_queries` / `prefix_cache_hits`, tokens) and processor-cache lookups
(`mm_cache_queries` / `mm_cache_hits`, clips); `computed` = prompt tokens less cached
ones, `computed_over_k1` its ratio to K = 1's, and `wall_over_tokens` = over_k1 /
computed_over_k1: 1.0 when a curve costs exactly its computed tokens. `voc` is the mean
value-order correlation of the largest K's curves on the moving-block episodes and on their
static (first frame repeated) and reversed versions: with random weights it shows the mechanics,
not the judge's accuracy.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.progress import prefix_ends, value_order_correlation
from reward_protocol.score import MAX_BATCH_ITEMS, ScoreOptions
from reward_tools.bench import TASKS, Episodes, style_kwargs

logger = logging.getLogger("reward_tools.bench_curves")

COUNTERS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "mm_cache_queries",
    "mm_cache_hits",
)


class Curves:
    def __init__(self, url: str, style: str):
        self.url = url
        self.style = style
        self.client = RewardClient(url, RetryPolicy(deadline_s=3600, timeout_s=3600))
        self.pool = ThreadPoolExecutor(8)

    def counters(self) -> dict[str, int]:
        stats = httpx.get(f"{self.url}/stats", timeout=30).json()
        return {k: int(stats.get(k, 0)) for k in COUNTERS}

    def _options(self, i: int, nframes: int, points: int) -> ScoreOptions:
        return ScoreOptions(
            task_text=TASKS[i % len(TASKS)],
            nframes=nframes,
            progress_points=points,
            backend_kwargs=style_kwargs(self.style),
        )

    def _send(self, episodes: list) -> list:
        """Raw batches of at most MAX_BATCH_ITEMS items, sent together."""
        chunks = [episodes[i : i + MAX_BATCH_ITEMS] for i in range(0, len(episodes), MAX_BATCH_ITEMS)]
        return [item for part in self.pool.map(self.client.score_episodes, chunks) for item in part]

    def curve(self, videos: list[np.ndarray], points: int) -> tuple[float, list]:
        """The hook's way: one raw batch, each episode asking for its K-point curve."""
        started = time.perf_counter()
        items = self._send([(self._options(i, len(v), points), v) for i, v in enumerate(videos)])
        wall = time.perf_counter() - started
        return wall, [(item.response.progress or [item.response.score]) if item.response else None for item in items]

    def plain(self, videos: list[np.ndarray], points: int) -> tuple[float, list]:
        """Without curves: every prefix sent as an episode of its own (one video each), K x N items."""
        started = time.perf_counter()
        episodes = [
            (self._options(i, end, 1), v[:end]) for i, v in enumerate(videos) for end in prefix_ends(len(v), points)
        ]
        items = self._send(episodes)
        wall = time.perf_counter() - started
        failed = {j // points for j, item in enumerate(items) if item.response is None}
        scores = [item.response.score if item.response else None for item in items]
        curves = [scores[i * points : (i + 1) * points] for i in range(len(videos))]
        return wall, [None if i in failed else c for i, c in enumerate(curves)]

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()


def measure(fn, videos, points, counters) -> dict:
    before = counters()
    began = time.monotonic()
    wall, answers = fn(videos, points)
    window = (began, time.monotonic())  # on the clock of the server's step log (steps_report)
    after = counters()
    # errors: episodes with a request that failed; unparsed: points answered with no number (a
    # random-weight model's free text), the same count for both ways
    row = {
        "k": points,
        "n": len(videos),
        "wall_s": round(wall, 4),
        "errors": sum(a is None for a in answers),
        "unparsed": sum(v is None for a in answers if a is not None for v in a),
        "window": window,
    }
    row.update({k: after[k] - before[k] for k in COUNTERS})
    return row


def mean_voc(curves: list) -> float | None:
    vocs = [v for c in curves if c is not None and (v := value_order_correlation(c)) is not None]
    return round(statistics.fmean(vocs), 4) if vocs else None


def run(
    curves: Curves, episodes: Episodes, n: int, points: list[int], repeats: int, plain: bool, voc: bool = True
) -> dict:
    for k in points:  # warm-up: every shape once
        curves.curve(episodes.take(min(n, 4)), k)
    rows = []
    for way, fn in (("curve", curves.curve), ("plain", curves.plain)):
        if way == "plain" and not plain:
            continue
        for k in points:
            if way == "plain" and k == 1:
                continue  # the same requests as the curve way's K = 1
            tries = sorted(
                (measure(fn, episodes.take(n), k, curves.counters) for _ in range(repeats)), key=lambda r: r["wall_s"]
            )
            row = tries[(len(tries) - 1) // 2]  # the median (the lower one of an even count)
            row["walls_s"] = [t["wall_s"] for t in tries]
            row["windows"] = [t["window"] for t in tries]
            row["way"] = way
            row["computed"] = row["prompt_tokens"] - row["cached_tokens"]
            rows.append(row)
            logger.info("%s", row)
    base = next(r for r in rows if r["way"] == "curve" and r["k"] == 1)
    for r in rows:
        r["over_k1"] = round(r["wall_s"] / base["wall_s"], 3)
        if base["computed"] > 0:
            r["computed_over_k1"] = round(r["computed"] / base["computed"], 3)
            r["wall_over_tokens"] = round(r["over_k1"] / r["computed_over_k1"], 3) if r["computed"] else None
    if not voc:
        return {"rows": rows}
    top = max(points)
    videos = episodes.take(n)
    vocs = {}
    for name, batch in (
        ("moving", videos),
        ("static", [np.repeat(v[:1], len(v), axis=0) for v in videos]),
        ("reversed", [np.ascontiguousarray(v[::-1]) for v in videos]),
    ):
        _, answers = curves.curve(batch, top)
        vocs[name] = mean_voc(answers)
    return {"rows": rows, "voc": {"k": top, **vocs}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.bench_curves",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="a running reward server")
    parser.add_argument("--launch", help="start a reward server with these flags (quoted), measure, stop it")
    parser.add_argument("--n", type=int, default=64, help="episodes ending together")
    parser.add_argument("--points", type=int, nargs="+", default=[1, 8, 16], help="curve sizes K (1 is the base)")
    parser.add_argument("--style", default="logprob", help="logprob, p_true, or genK (K new tokens per point)")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="repeats per row, on new episodes; the median counts")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain way (K separate prefix requests)")
    parser.add_argument("--no-voc", action="store_true", help="skip the VOC curves of moving/static/reversed episodes")
    parser.add_argument("--first-seed", type=int, default=None, help="seed of the first episode (default: random)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--startup-timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if (args.url is None) == (args.launch is None):
        parser.error("give exactly one of --url and --launch")
    if 1 not in args.points:
        args.points = [1, *args.points]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    first_seed = args.first_seed if args.first_seed is not None else secrets.randbelow(2**20) * 1_000_000

    server = None
    url = args.url
    if args.launch is not None:
        from reward_tools.launch import ServerProcess

        log = Path(args.out).with_suffix(".server.log") if args.out else Path(tempfile.mkdtemp()) / "server.log"
        server = ServerProcess(
            [*shlex.split(args.launch), "--max-progress-points", str(max(args.points))], log_path=log
        )
        server.start()
        server.wait_ready(args.startup_timeout)
        url = server.url
    curves = Curves(url, args.style)
    episodes = Episodes(args.frames, args.size, first_seed)
    try:
        report = {
            "launch": args.launch,
            "server": httpx.get(f"{url}/health", timeout=10).json(),
            "workload": {"n": args.n, "frames": args.frames, "size": args.size, "style": args.style},
            **run(curves, episodes, args.n, args.points, args.repeats, not args.no_plain, not args.no_voc),
            "host": {"python": platform.python_version(), "machine": platform.machine()},
        }
    finally:
        curves.close()
        if server is not None:
            server.stop()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 1 if any(r["errors"] for r in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
