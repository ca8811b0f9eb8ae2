"""Measure what stalled uploads do to everyone else: N connections that start a body (declaring
512 MiB, or chunked) and then send one byte every 2 s, while another client sends small valid
`POST /score` requests. Prints (and writes) the share of small requests served, how the stalled
ones ended, and the server's memory growth (its process tree, sampled every 0.25 s).

    python -m reward_tools.stalled_uploads --stalled 8 64 --seconds 45 --out docs/bench/stalled_uploads.json

Starts its own server on the fake engine on 127.0.0.1 (flags in --launch); bounded in time
(--seconds per case) and connections (the largest --stalled). A cut upload is reopened, so N
stay stalled for the whole case.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import statistics
import threading
import time
from pathlib import Path

import httpx

from reward_protocol.score import InlineFrames
from reward_tools.bench import episode
from reward_tools.launch import ServerProcess
from reward_tools.memory import tree_rss_bytes
from reward_tools.stalled_upload import StalledUpload

logger = logging.getLogger("stalled_uploads")
DECLARED = 512 * 2**20


def small_body(i: int) -> dict:
    frames = InlineFrames.from_array(episode(i, frames=4, size=64)).model_dump()
    return {"task_text": "pick up the cup", "frames": frames}


def run_case(server: ServerProcess, stalled: int, chunked: bool, seconds: float, tick_s: float) -> dict:
    assert server.proc is not None
    pid = server.proc.pid
    stop = threading.Event()
    samples: list[int] = []

    def sample() -> None:
        while not stop.is_set():
            samples.append(tree_rss_bytes(pid))
            time.sleep(0.25)

    with httpx.Client(timeout=30) as client:
        for i in range(5):  # warm: the first requests allocate what every later one reuses
            client.post(f"{server.url}/score", json=small_body(i))
        baseline = tree_rss_bytes(pid)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        declared = None if chunked else DECLARED
        uploads = [StalledUpload(server.port, declared) for _ in range(stalled)]
        ended: list[StalledUpload] = []
        codes: dict[str, int] = {}
        latencies: list[float] = []
        started = time.monotonic()
        next_tick = started + tick_s
        i = 100
        while time.monotonic() - started < seconds:
            if time.monotonic() >= next_tick:
                next_tick += tick_s
                for k, up in enumerate(uploads):
                    if not up.tick():
                        ended.append(up)
                        uploads[k] = StalledUpload(server.port, declared)
            t0 = time.perf_counter()
            try:
                r = client.post(f"{server.url}/score", json=small_body(i), timeout=10)
                code = str(r.status_code)
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            latencies.append(time.perf_counter() - t0)
            codes[code] = codes.get(code, 0) + 1
            i += 1
            time.sleep(0.2)
        stats = client.get(f"{server.url}/stats").json()
        for up in uploads:
            up.close()
        stop.set()
        sampler.join()
    served = codes.get("200", 0)
    lived = [up for up in ended if up.status is not None]
    return {
        "stalled": stalled,
        "framing": "chunked" if chunked else f"Content-Length {DECLARED}",
        "seconds": seconds,
        "small_requests": sum(codes.values()),
        "small_served": served,
        "served_share": served / max(1, sum(codes.values())),
        "small_codes": codes,
        "small_p50_ms": statistics.median(latencies) * 1000 if latencies else None,
        "stalled_ended_by_server": len(ended),
        "stalled_end_statuses": sorted({f"{up.status} {up.error_type}" for up in lived}),
        "stalled_bytes_sent_max": max((up.sent for up in ended), default=None),
        "bytes_in_progress_at_end": stats.get("bytes_in_progress"),
        "rss_baseline_gib": baseline / 2**30,
        "rss_peak_gib": max(samples, default=baseline) / 2**30,
        "rss_growth_gib": (max(samples, default=baseline) - baseline) / 2**30,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalled", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--seconds", type=float, default=45.0, help="per case (bounded: at most 300)")
    parser.add_argument("--tick-s", type=float, default=2.0, help="one byte per stalled upload this often")
    parser.add_argument("--launch", default="--engine fake --decode-workers 1", help="server flags")
    parser.add_argument("--server-pythonpath", help="run the server from this source tree (a before/after run)")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    seconds = min(args.seconds, 300.0)
    env = {"PYTHONPATH": args.server_pythonpath} if args.server_pythonpath else None
    if args.out:
        args.out = args.out.resolve()
    if args.server_pythonpath:
        os.chdir(args.server_pythonpath)  # `python -m` puts the working directory first on the path
    cases = []
    for stalled in args.stalled:
        for chunked in (False, True):
            # a fresh server per case: one case's leftovers never count against the next
            with ServerProcess(shlex.split(args.launch), env=env, log_path=f"/tmp/stalled-{os.getpid()}.log") as s:
                s.wait_ready(120)
                case = run_case(s, min(stalled, 256), chunked, seconds, args.tick_s)
            logger.info(json.dumps(case))
            cases.append(case)
    report = {"label": args.label, "server_flags": args.launch, "tick_s": args.tick_s, "cases": cases}
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
