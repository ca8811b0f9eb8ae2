#!/usr/bin/env python3
"""Compare the A/B/C runs: read each run's TensorBoard logs, plot the key curves, write a CSV.

    python -m reward_tools.compare_runs --run A=RLINF/logs/<ts>-..._runA --run B=... --run C=... --out results/abc

Each run directory is RLinf's `runner.logger.log_path` (event files under `tensorboard/`, or
anywhere below). Writes OUT.png (one panel per metric, one line per run) and OUT.csv
(run, metric, step, value). A metric a run does not log (env/vlm_score in run A) is left out
of that run's panel and said so on stderr. Runs that log the live judge audit (B, C) are also
compared on it: OUT-audit.png and OUT-audit.csv (reward_tools/compare_audit.py).
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from pathlib import Path

from reward_tools.tb_scalars import read_scalars

logger = logging.getLogger("compare_runs")

METRICS = ("env/success_once", "env/return", "env/vlm_score", "eval/success_once")


TITLE = "LIBERO-10 GRPO: native reward (A) vs VLM judges (B: Qwen2.5-VL, C: PRIMO-R1)"


def plot(
    runs: dict[str, dict[str, list[tuple[int, float]]]], metrics: tuple[str, ...], out_png: Path, title: str = TITLE
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = 2
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    colors = {name: f"C{i}" for i, name in enumerate(runs)}  # one colour per run in every panel
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for name, series in runs.items():
            points = series.get(metric) or []
            if points:
                steps, values = zip(*points, strict=True)
                # markers keep short runs, and runs drawn over one another, visible
                ax.plot(steps, values, label=f"run {name}", color=colors[name], linewidth=1.6, marker="o", markersize=4)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "not logged by any run", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="NAME=LOG_DIR", help="repeat per run")
    parser.add_argument("--out", required=True, help="output prefix: writes OUT.png and OUT.csv")
    parser.add_argument("--metric", action="append", help=f"metrics to plot (default: {', '.join(METRICS)})")
    parser.add_argument("--title", default=TITLE, help="the figure's title")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    metrics = tuple(args.metric or METRICS)

    runs: dict[str, dict[str, list[tuple[int, float]]]] = {}
    run_dirs: dict[str, Path] = {}
    for spec in args.run:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"--run takes NAME=LOG_DIR, got {spec!r}")
        runs[name] = read_scalars(Path(path), metrics)
        run_dirs[name] = Path(path)
        missing = [m for m in metrics if not runs[name][m]]
        if missing:
            logger.info("run %s does not log: %s", name, ", ".join(missing))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "metric", "step", "value"])
        for name, series in runs.items():
            for metric in metrics:
                for step, value in series[metric]:
                    writer.writerow([name, metric, step, value])
    plot(runs, metrics, out.with_suffix(".png"), args.title)
    logger.info("wrote %s and %s", out.with_suffix(".png"), out.with_suffix(".csv"))
    from reward_tools.compare_audit import write as write_audit

    audit_png = write_audit(run_dirs, out)
    if audit_png is not None:
        logger.info("wrote %s and %s", audit_png, audit_png.with_suffix(".csv"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
