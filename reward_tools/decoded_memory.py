"""Measure the server's memory around bursts of episodes that decode to gigabytes: a batch of
--items items naming one 128-frame 1080p MP4 under the video root, with nframes 128 and the
largest max_pixels (issue 30's case), sent --bursts times. Or, with --chat-requests N, N chat
requests at once (/v1/chat/completions), each of --images JPEG data URLs of --width x --height.
Samples the server's main process (and its process tree) every 0.1 s; prints the baseline, each
burst's peak, what is kept after each burst (settled), and /stats' decoded_mb_* keys.

    python -m reward_tools.decoded_memory --launch "--engine fake --decode-workers 2" --out docs/bench/x.json
    python -m reward_tools.decoded_memory --chat-requests 8 --images 16 --launch "..."

The MP4 is made here, at run time (reward_client.video_io). The server is started on 127.0.0.1
with --video-root set to a temporary directory; everything is bounded (--bursts, --timeout-s).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import logging
import os
import shlex
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from reward_client.video_io import write_mp4
from reward_protocol.score import MAX_MAX_PIXELS
from reward_tools.bench_chat import jpeg_data_url
from reward_tools.launch import ServerProcess
from reward_tools.memory import tree_rss_bytes

logger = logging.getLogger("decoded_memory")
GIB = 2**30


def synthetic_video(frames: int, height: int, width: int) -> np.ndarray:
    """A smooth gradient with a moving block: compresses well, so the file stays small."""
    y = np.linspace(40, 200, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 60, width, dtype=np.float32)[None, :]
    base = np.stack([y + x, np.broadcast_to(y, (height, width)), np.broadcast_to(200 - x, (height, width))], -1)
    video = np.repeat(base.astype(np.uint8)[None], frames, axis=0)
    for t in range(frames):
        left = int((width - 200) * t / max(1, frames - 1))
        video[t, height // 3 : height // 3 + 200, left : left + 200] = (220, 40, 40)
    return video


class Sampler:
    """RSS of the main process and of its tree, every period_s, in a thread."""

    def __init__(self, pid: int, period_s: float = 0.1):
        self.proc = psutil.Process(pid)
        self.period_s = period_s
        self.main: list[tuple[float, int]] = []
        self.tree: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> tuple[int, int]:
        return self.proc.memory_info().rss, tree_rss_bytes(self.proc.pid)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            main, tree = self.now()
            self.main.append((t, main))
            self.tree.append((t, tree))
            time.sleep(self.period_s)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak_since(self, t0: float) -> tuple[int, int]:
        main = max((v for t, v in self.main if t >= t0), default=0)
        tree = max((v for t, v in self.tree if t >= t0), default=0)
        return main, tree


def chat_body(args: argparse.Namespace, seed: int) -> dict:
    """One chat request of --images JPEG data URLs of --width x --height (different pixels each)."""
    base = synthetic_video(args.images, args.height, args.width)
    noise = np.random.default_rng(seed).integers(0, 24, size=(args.images, 1, args.width, 3), dtype=np.uint8)
    content: list[dict] = [
        {"type": "image_url", "image_url": {"url": jpeg_data_url(np.ascontiguousarray(img + noise[i]), 90)}}
        for i, img in enumerate(base)
    ]
    content.append({"type": "text", "text": f"Did the robot {args.task_text}? Answer yes or no."})
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0.0}


def send_chat(client: httpx.Client, url: str, body: dict, count: int) -> tuple[list[int], list[str]]:
    """`count` copies of one chat request at once; each answer's status and error code (or 'answered')."""

    def one(_: int) -> httpx.Response:
        return client.post(f"{url}/v1/chat/completions", json=body)

    with cf.ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(one, range(count)))
    codes = [a.json()["error"]["code"] if a.status_code != 200 else "answered" for a in answers]
    return [a.status_code for a in answers], codes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launch", default="--engine fake --decode-workers 2", help="server flags")
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--bursts", type=int, default=2)
    parser.add_argument("--frames", type=int, default=128)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait after a burst before reading 'kept'")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per burst")
    parser.add_argument("--ready-timeout-s", type=float, default=600.0)
    parser.add_argument("--server-pythonpath", help="run the server from this source tree (a before/after run)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="server environment")
    parser.add_argument(
        "--stop-if-kept-gib", type=float, help="send no further burst once this much is kept (a shared machine)"
    )
    parser.add_argument("--chat-requests", type=int, default=0, help="a burst is N chat requests at once instead")
    parser.add_argument("--images", type=int, default=16, help="images per chat request (--width x --height)")
    parser.add_argument("--task-text", default="pick up the cup")
    parser.add_argument("--server-log", help="keep the server's log here")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    env = dict(item.split("=", 1) for item in args.env)
    if args.out:
        args.out = args.out.resolve()
    if args.server_pythonpath:
        env["PYTHONPATH"] = args.server_pythonpath
        os.chdir(args.server_pythonpath)  # `python -m` puts the working directory first on the path
    with tempfile.TemporaryDirectory(prefix="decoded-memory-") as root:
        video = os.path.join(root, "episode.mp4")
        if not args.chat_requests:
            t0 = time.perf_counter()
            write_mp4(synthetic_video(args.frames, args.height, args.width), video)
            size_mb = os.path.getsize(video) / 2**20
            logger.info("wrote %s (%.1f MB) in %.1f s", video, size_mb, time.perf_counter() - t0)
        item = {"task_text": args.task_text, "video_path": video, "nframes": args.frames}
        item["max_pixels"] = MAX_MAX_PIXELS
        # two bodies with different pixels, sent in turn: no burst repeats the one before it
        chat_bodies = [chat_body(args, seed) for seed in (1, 2)] if args.chat_requests else []
        flags = [*shlex.split(args.launch), "--video-root", root]
        bursts = []
        with ServerProcess(flags, env=env, log_path=args.server_log or os.path.join(root, "server.log")) as server:
            server.wait_ready(args.ready_timeout_s)
            assert server.proc is not None
            time.sleep(args.settle_s)
            sampler = Sampler(server.proc.pid).start()
            base_main, base_tree = sampler.now()
            with httpx.Client(timeout=args.timeout_s) as client:
                for burst in range(args.bursts):
                    started = time.monotonic()
                    if args.chat_requests:
                        status, outcome = send_chat(client, server.url, chat_bodies[burst % 2], args.chat_requests)
                    else:
                        r = client.post(f"{server.url}/score/batch", json={"requests": [item] * args.items})
                        results = r.json().get("results", []) if r.status_code == 200 else []
                        status = r.status_code
                        outcome = [res["error"]["type"] if res.get("error") else "scored" for res in results]
                        outcome = outcome or r.text[:300]
                    elapsed = time.monotonic() - started
                    time.sleep(args.settle_s)
                    peak_main, peak_tree = sampler.peak_since(started)
                    kept_main, kept_tree = sampler.now()
                    stats = client.get(f"{server.url}/stats").json()
                    bursts.append(
                        {
                            "status": status,
                            "items": outcome,
                            "seconds": round(elapsed, 2),
                            "main_peak_gib": round(peak_main / GIB, 3),
                            "main_after_gib": round(kept_main / GIB, 3),
                            "main_kept_gib": round((kept_main - base_main) / GIB, 3),
                            "tree_peak_gib": round(peak_tree / GIB, 3),
                            "tree_after_gib": round(kept_tree / GIB, 3),
                            "decoded": {k: v for k, v in stats.items() if k.startswith("decoded_mb")},
                        }
                    )
                    logger.info("burst %d: %s", burst + 1, json.dumps(bursts[-1]))
                    if args.stop_if_kept_gib is not None and kept_main - base_main > args.stop_if_kept_gib * GIB:
                        logger.info("stopping: %.1f GiB kept", (kept_main - base_main) / GIB)
                        break
            sampler.stop()
    report = {
        "label": args.label,
        "server_flags": args.launch,
        "server_env": {k: v for k, v in env.items() if k != "PYTHONPATH"},
        "video": f"{args.frames} frames {args.width}x{args.height} MP4, nframes {args.frames}, "
        f"max_pixels {MAX_MAX_PIXELS}, {args.items} items per batch",
        "chat": f"{args.chat_requests} chat requests at once, {args.images} JPEG images of {args.width}x{args.height}"
        if args.chat_requests
        else None,
        "main_baseline_gib": round(base_main / GIB, 3),
        "tree_baseline_gib": round(base_tree / GIB, 3),
        "bursts": bursts,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
