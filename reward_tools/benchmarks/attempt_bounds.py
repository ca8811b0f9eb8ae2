#!/usr/bin/env python3
"""The issue-42 time-bound reproduction, scaled down: a batch of 2 episodes the engine answers in
1.5 s each, sent with a per-attempt timeout shorter than that (1 s, as the hook's 300 s against
the server's 600 s) and with the client's default bound, within a 5 s deadline. Prints attempts,
engine requests and aborts, and scores per case as JSON (the real app on the fake engine, in
process, real HTTP).

    PYTHONPATH=. python -m reward_tools.benchmarks.attempt_bounds [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from reward_client.client import RetryPolicy, RewardClient, RewardClientError
from reward_protocol.score import ScoreOptions
from reward_tools.in_process import InProcessServer


def case(timeout_s: float | None) -> dict:
    with InProcessServer(engine_option=["delay_ms=1500"]) as server:
        episodes = [(ScoreOptions(task_text="open the drawer", nframes=2), np.full((2, 28, 28, 3), 100, np.uint8))] * 2
        policy = RetryPolicy(deadline_s=5.0, timeout_s=timeout_s)
        client = RewardClient(server.url, policy)
        started = time.monotonic()
        try:
            items = client.score_episodes(episodes)
            scores = sum(i.response is not None and i.response.score is not None for i in items)
            error = None
        except RewardClientError as exc:
            scores, error = 0, str(exc)[:200]
        wall = time.monotonic() - started
        engine = server.stats()
        time.sleep(0.2)
        return {
            "timeout_s": timeout_s,
            "deadline_s": 5.0,
            "attempts": client.attempts,
            "engine_requests": engine["requests"],
            "engine_aborted": server.stats()["aborted"],
            "scores": scores,
            "wall_s": round(wall, 2),
            "error": error,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    report = {"per_attempt_1s": case(1.0), "default_bound": case(None)}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
