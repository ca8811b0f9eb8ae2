"""CPU smoke demo: start `python -m reward_server` with its embedded default (a tiny
random-weight checkpoint, built locally, and the settings it brings for a CPU machine), score
one sample episode three ways (video_path, inline frames in logprob mode, and the raw batch
the RLinf hook sends), print the answers as JSON, stop the server.

    python -m reward_tools.demo [--engine vllm|hf] [--backend NAME] [--model-path DIR]
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

from reward_tools.launch import ServerProcess

logger = logging.getLogger("reward_tools.demo")

TASK = "put both the alphabet soup and the tomato sauce in the basket"


def sample_episode(steps: int = 48, size: int = 128) -> np.ndarray:
    """A synthetic episode: a red block slides into a brown basket on a grey table."""
    frames = np.full((steps, size, size, 3), 150, dtype=np.uint8)
    basket = slice(size * 5 // 8, size * 7 // 8)
    for t in range(steps):
        frames[t, basket, basket] = (120, 80, 40)
        x = int(size // 8 + (size * 5 // 8) * t / (steps - 1))
        frames[t, x : x + size // 8, x : x + size // 8] = (200, 30, 30)
    return frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--backend", default="qwen2_5_vl_vllm")
    parser.add_argument("--model-path", default=None, help="default: a random-weight tiny checkpoint built locally")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    import httpx

    from reward_client.client import RewardClient, RewardClientError
    from reward_client.video_io import write_mp4
    from reward_protocol.score import BackendKwargs, ScoreOptions

    frames = sample_episode()
    with tempfile.TemporaryDirectory(prefix="reward-demo-") as tmp:
        video = write_mp4(frames, Path(tmp) / "episode.mp4", fps=10)
        flags = ["--engine", args.engine, "--backend", args.backend, "--video-root", tmp]
        if args.model_path:
            flags += ["--model-path", args.model_path]
        with ServerProcess(flags, log_path=Path(tmp) / "server.log") as server:
            server.wait_ready(args.startup_timeout)
            logger.info("server ready at %s; scoring the sample episode", server.url)
            inline = {"shape": list(frames.shape), "data_b64": base64.b64encode(frames.tobytes()).decode()}
            with httpx.Client(base_url=server.url, timeout=300) as client:
                health = client.get("/health").json()
                by_path = client.post("/score", json={"task_text": TASK, "video_path": video, "nframes": 16})
                by_frames = client.post(
                    "/score",
                    json={"task_text": TASK, "frames": inline, "backend_kwargs": {"score_mode": "logprob"}},
                )
            answers = {"video_path": by_path, "inline_frames_logprob": by_frames}
            report = {"health": health, **{name: r.json() for name, r in answers.items()}}
            failed = [name for name, r in answers.items() if r.status_code != 200]
            # what the RLinf hook sends: every episode that ended, raw frames in one batch body
            options = ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(score_mode="logprob"))
            try:
                with RewardClient(server.url) as reward:
                    items = reward.score_episodes([(options, frames), (options, frames[::-1].copy()), (options, video)])
                report["raw_batch"] = [item.model_dump(mode="json") for item in items]
                failed += [f"raw_batch[{item.index}]" for item in items if item.error is not None]
            except RewardClientError as exc:
                report["raw_batch"] = str(exc)
                failed.append("raw_batch")
            print(json.dumps(report, indent=2))
            if failed:
                logger.error("requests failed: %s; server log: %s", failed, server.log_tail())
                return 1
    logger.info("demo finished: server stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
