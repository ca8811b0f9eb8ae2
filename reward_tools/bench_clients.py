"""Throughput with several client processes, each sending its own batch, as RLinf's env workers do.

    python -m reward_tools.bench_clients --url http://127.0.0.1:18080 --clients 2 4 --n 64
    python -m reward_tools.bench_clients --url http://10.0.0.1:18080,http://10.0.0.2:18080 ...  (replica list)

RLinf runs many env workers; in each, the envs that end in a step go to the reward server in one
batch. A scale-out that one client process cannot feed (one process sends every body) must be
measured this way. For each client count P and style, P processes each build their own episodes
(16 frames of 256x256 by default, never sent before: distinct seeds per process and round), wait
at a barrier, and send them on the hook's path (`RewardClient.score_episodes`: one raw batch; a
comma-separated replica list is split across the replicas, as the hook does). A round's wall time
runs from the first client's start to the last client's answer; throughput is P x N episodes over
it. `--warmup-rounds` rounds run first and are not counted (connections, the server's first
batches). Prints JSON (one row per P and style: the median round as wall_s, and the best) and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import queue
import statistics
import sys
import time
from pathlib import Path

from reward_tools.bench import TASKS, Episodes, style_kwargs

logger = logging.getLogger("reward_tools.bench_clients")

SEEDS_PER_CLIENT = 1_000_000  # a block of episode seeds per (row, client): no episode is sent twice


def _client(
    index: int, first_seed: int, url: str, n: int, style: str, rounds: int, frames: int, size: int, barrier, results
) -> None:
    """One env worker: its own episodes and client; one batch per round, started at the barrier."""
    from reward_client.client import RetryPolicy, RewardClient
    from reward_protocol.score import ScoreOptions

    episodes = Episodes(frames, size)
    episodes.next_seed = first_seed
    batches = [episodes.take(n) for _ in range(rounds)]  # built before the clock starts
    kwargs = style_kwargs(style)
    out = []
    with RewardClient(url.split(","), RetryPolicy(deadline_s=3600, timeout_s=3600)) as client:
        for videos in batches:
            work = [
                (ScoreOptions(task_text=TASKS[i % len(TASKS)], nframes=frames, backend_kwargs=kwargs), v)
                for i, v in enumerate(videos)
            ]
            barrier.wait(timeout=3600)  # a client that died breaks it for the others
            started = time.monotonic()  # one clock for every process on the host
            try:
                items = client.score_episodes(work)
                errors = sum(item.response is None for item in items)
            except Exception as exc:  # counted, reported; the other clients go on
                logger.warning("client %d: %s", index, exc)
                errors = n
            out.append((started, time.monotonic(), errors))
    results.put((index, out))


def run_clients(
    url: str, clients: int, n: int, style: str, rounds: int, warmup: int, frames: int, size: int, row: int = 0
) -> dict:
    """One row: `clients` processes, `warmup` uncounted rounds then `rounds` counted ones."""
    ctx = mp.get_context("spawn")  # children start clean (no inherited sockets or threads)
    barrier = ctx.Barrier(clients)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_client,
            args=(
                i,
                (row * 1000 + i + 1) * SEEDS_PER_CLIENT,
                url,
                n,
                style,
                warmup + rounds,
                frames,
                size,
                barrier,
                results,
            ),
            name=f"bench-client-{i}",
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    per_client: dict[int, list] = {}
    try:
        while len(per_client) < clients:
            try:
                index, out = results.get(timeout=1)
                per_client[index] = out
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{dead[0].name} exited with code {dead[0].exitcode}") from None
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
    counted = []
    for r in range(warmup, warmup + rounds):
        starts, ends, errors = zip(*(per_client[i][r] for i in range(clients)), strict=True)
        wall = max(ends) - min(starts)
        counted.append(
            {
                "wall_s": wall,
                "episodes_per_s": clients * n / wall,
                "client_s": [e - s for s, e in zip(starts, ends, strict=True)],
                "errors": sum(errors),
            }
        )
    best = min(counted, key=lambda r: r["wall_s"])
    median = statistics.median(r["wall_s"] for r in counted)
    return {
        "url": url,
        "replicas": len(url.split(",")),
        "clients": clients,
        "n_per_client": n,
        "episodes": clients * n,
        "style": style,
        "wall_s": median,  # compared rows use the median round
        "episodes_per_s": clients * n / median,
        "best_wall_s": best["wall_s"],
        "median_wall_s": median,
        "errors": sum(r["errors"] for r in counted),
        "rounds": counted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.bench_clients",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="a server or Ray Serve proxy; a comma-separated replica list")
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[2, 4], help="client processes (several: one row each)"
    )
    parser.add_argument("--n", type=int, default=64, help="episodes per client per round")
    parser.add_argument("--styles", nargs="+", default=["logprob"], help="logprob or genK (e.g. gen256)")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds (the median, and the best, are reported)")
    parser.add_argument("--warmup-rounds", type=int, default=1)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument(
        "--replicas", type=int, help="replicas behind the URL, for the report (default: the URLs given; Ray Serve: say)"
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if min(args.clients) < 1 or args.n < 1 or args.rounds < 1 or args.warmup_rounds < 0:
        parser.error("--clients, --n and --rounds must be >= 1, --warmup-rounds >= 0")
    for style in args.styles:
        try:
            style_kwargs(style)
        except ValueError as exc:
            parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rows = []
    for style in args.styles:
        for clients in args.clients:
            row = run_clients(
                args.url, clients, args.n, style, args.rounds, args.warmup_rounds, args.frames, args.size, len(rows)
            )
            row["replicas"] = args.replicas or row["replicas"]
            logger.info(
                "%d clients x %d episodes (%s): %.2f s, %.1f episodes/s, %d errors",
                clients,
                args.n,
                style,
                row["wall_s"],
                row["episodes_per_s"],
                row["errors"],
            )
            rows.append(row)
    report = {"workload": {"frames": args.frames, "size": args.size, "max_pixels": 200704}, "results": rows}
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
