#!/usr/bin/env python3
"""Per-step summary of tiny A/B/C runs from the TensorBoard files RLinf's runner wrote.

    python -m reward_tools.tiny_summary --run A=LOG_DIR --run B=LOG_DIR --run C=LOG_DIR

One line per run and training step: LIBERO's success, the env's mean episode return, the judge's
mean score, fallbacks and latency, and what `algorithm.filter_rewards` did. RLinf logs no group
counts; its `rollout/*` metrics are taken over the samples the filter kept, so with one GRPO
group per step (the tiny runs) `rollout/rewards` is NaN exactly when that group was dropped.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from reward_tools.tb_scalars import read_scalars

COLUMNS = (
    ("env/success_once", "success", "{:.2f}"),
    ("env/return", "return", "{:.3f}"),
    ("env/vlm_score", "vlm_score", "{:.3f}"),
    ("env/vlm_fallback", "fallback", "{:.0f}"),
    ("env/vlm_latency_ms", "latency_ms", "{:.0f}"),
    ("rollout/rewards", "trained_reward", "{:.4f}"),
    ("env/vlm_moved_reward", "moved", "{:.3f}"),
)


def summarize(runs: dict[str, Path]) -> list[str]:
    metrics = tuple(m for m, _, _ in COLUMNS)
    header = f"{'run':<4}{'step':>5}" + "".join(f"{name:>16}" for _, name, _ in COLUMNS) + f"{'group':>10}"
    lines = [header]
    for name, log_dir in runs.items():
        series = {m: dict(points) for m, points in read_scalars(log_dir, metrics).items()}
        for step in sorted(series["env/return"]):
            cells = []
            for metric, _, fmt in COLUMNS:
                value = series[metric].get(step)
                cells.append("-" if value is None else fmt.format(value))
            trained = series["rollout/rewards"].get(step)
            group = "?" if trained is None else "dropped" if math.isnan(trained) else "kept"
            lines.append(f"{name:<4}{step:>5}" + "".join(f"{c:>16}" for c in cells) + f"{group:>10}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=LOG_DIR", help="repeat per run")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.run:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--run takes NAME=LOG_DIR, got {spec!r}")
        runs[name] = Path(path)
    sys.stdout.write("\n".join(summarize(runs)) + "\n")
    sys.stdout.write(
        "trained_reward: RLinf's rollout/rewards, mean reward over the samples the actor trained on "
        "(after filter_rewards); group: the step's one GRPO group, kept or dropped by filter_rewards; moved "
        "(run D): reward a progress curve moved back from the done step to where it was earned\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
