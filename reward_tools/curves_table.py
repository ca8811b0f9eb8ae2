"""One markdown table from reward_tools.bench_curves reports: per server setting and K, the wall
time (median), its repeats and how far apart they are (slowest over fastest), its ratio to K = 1,
the computed-token ratio and the wall/token ratio.

    python -m reward_tools.curves_table out/curves_logprob_today.json out/curves_logprob_default.json

A file named `curves_<style>_<setting>.json` (scripts/gpu/bench_gpu.sh curves) names its row by
<setting>; any other file by its stem.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HEADER = (
    "| style | setting | way | K | N | wall s (median) | walls s | spread | / K = 1 | computed tokens "
    "| computed / K = 1 | wall / tokens | errors |"
)


def setting_name(path: Path, style: str) -> str:
    prefix = f"curves_{style}_"
    return path.stem[len(prefix) :] if path.stem.startswith(prefix) else path.stem


def spread(walls: list[float]) -> str:
    """How far apart a row's repeats are: (slowest - fastest) / fastest, in percent (issue 40's
    goal: within 10%); "-" for a single repeat."""
    if len(walls) < 2 or min(walls) <= 0:
        return "-"
    return f"{(max(walls) - min(walls)) / min(walls) * 100:.1f}%"


def table(paths: list[Path]) -> str:
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for path in paths:
        report = json.loads(path.read_text())
        style = report["workload"]["style"]
        name = setting_name(path, style)
        for r in report["rows"]:
            walls = r.get("walls_s", [r["wall_s"]])
            cells = [
                style,
                name,
                r["way"],
                r["k"],
                r["n"],
                f"{r['wall_s']:.2f}",
                " ".join(f"{w:.2f}" for w in walls),
                spread(walls),
                f"{r['over_k1']:.2f}",
                r.get("computed", r["prompt_tokens"] - r["cached_tokens"]),
                r.get("computed_over_k1", ""),
                r.get("wall_over_tokens", ""),
                r["errors"],
            ]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reward_tools.curves_table", description=__doc__)
    parser.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args(argv)
    sys.stdout.write(table(args.reports) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
