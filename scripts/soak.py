#!/usr/bin/env python3
"""Bounded soak: many requests against one server, then its memory growth and error count.

    python scripts/soak.py --launch "--config configs/server/cpu_tiny.yaml" --requests 3000 --max-seconds 900

Sends --requests requests, --concurrency at a time, stopping early at --max-seconds: mostly valid
episodes (logprob scoring), with one bad request in ten (unknown field, missing file, broken
frames) that must be refused cleanly. Reports status counts, unexpected answers (5xx, transport
errors), and the server's resident memory (its process tree) after warm-up and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shlex
import sys
import time
from pathlib import Path

import httpx
import psutil

from reward_client.protocol import InlineFrames
from reward_tools.bench import episode
from reward_tools.launch import ServerProcess


def rss_mib(pid: int) -> float:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def body(i: int) -> dict:
    frames = InlineFrames.from_array(episode(i % 50, frames=8, size=64)).model_dump()
    kind = i % 10
    if kind == 7:
        return {"task_text": "t", "frames": frames, "backend_kwargs": {"bogus": 1}}
    if kind == 8:
        return {"task_text": "t", "video_path": "/tmp/does-not-exist.mp4"}
    if kind == 9:
        return {"task_text": "t", "frames": {"shape": [2, 8, 8, 3], "data_b64": "AAAA"}}
    return {"task_text": f"task {i}", "frames": frames, "backend_kwargs": {"score_mode": "logprob"}}


async def soak(url: str, requests: int, concurrency: int, max_seconds: float) -> dict:
    codes: collections.Counter = collections.Counter()
    unexpected: list[str] = []
    sent = 0
    deadline = time.monotonic() + max_seconds
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def worker() -> None:
            nonlocal sent
            while sent < requests and time.monotonic() < deadline:
                i = sent
                sent += 1
                try:
                    r = await client.post("/score", json=body(i))
                    codes[r.status_code] += 1
                    expected = 200 if i % 10 < 7 else (422, 400, 403)
                    if r.status_code >= 500 or (i % 10 < 7 and r.status_code != expected):
                        unexpected.append(f"#{i}: {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    codes["transport_error"] += 1
                    unexpected.append(f"#{i}: {type(exc).__name__}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"sent": sent, "codes": dict(codes), "unexpected": unexpected[:20], "unexpected_count": len(unexpected)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch", required=True, help="server flags (quoted)")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-seconds", type=float, default=900)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with ServerProcess(shlex.split(args.launch), log_path=Path("/tmp") / f"soak-{time.time_ns()}.log") as server:
        server.wait_ready(600)
        asyncio.run(soak(server.url, 100, args.concurrency, 120))  # warm-up: allocations settle
        rss_start = rss_mib(server.proc.pid)
        started = time.monotonic()
        report = asyncio.run(soak(server.url, args.requests, args.concurrency, args.max_seconds))
        report["seconds"] = time.monotonic() - started
        report["rss_mib_after_warmup"] = rss_start
        report["rss_mib_end"] = rss_mib(server.proc.pid)
        report["rss_growth_mib"] = report["rss_mib_end"] - rss_start
        report["health_end"] = httpx.get(f"{server.url}/health").json()["status"]
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0 if report["unexpected_count"] == 0 and report["health_end"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
