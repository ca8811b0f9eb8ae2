"""The live judge audit of runs B and C side by side (called by compare_runs.py).

Reads `env/vlm_audit/*` and `env/vlm_canary/*` (reward_client.rlinf.audit) from each run's TensorBoard
logs and writes OUT-audit.png and OUT-audit.csv (run, metric, step, value). The top row compares
the runs on AUROC, false-positive and false-negative rate at success_threshold and ECE; below,
one row per run: canary scores beside the real successes' and failures' means, then AUROC and the
best threshold per task. Runs that log no audit (run A) are left out and said so.
"""

from __future__ import annotations

import csv
import logging
import re
from pathlib import Path

from reward_tools.tb_scalars import event_dir, read_scalars

logger = logging.getLogger("compare_runs")

OVERALL = ("env/vlm_audit/auroc", "env/vlm_audit/fpr", "env/vlm_audit/fnr", "env/vlm_audit/ece")
CANARY = (
    "env/vlm_canary/real_success",
    "env/vlm_canary/real_failure",
    "env/vlm_canary/static",
    "env/vlm_canary/reversed",
    "env/vlm_canary/wrong_task",
)
PER_TASK = re.compile(r"^env/vlm_audit/([^/]+)/(auroc|best_threshold)$")

Series = dict[str, list[tuple[int, float]]]


def audit_tags(run_dir: Path) -> tuple[str, ...]:
    """Every audit or canary scalar the run logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    for events in event_dir(run_dir).rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        tags.update(t for t in acc.Tags().get("scalars", []) if t.startswith(("env/vlm_audit/", "env/vlm_canary/")))
    return tuple(sorted(tags))


def _lines(ax, series: Series, metrics, labels=None) -> None:
    for i, metric in enumerate(metrics):
        points = series.get(metric) or []
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, label=(labels or metrics)[i], color=f"C{i}", linewidth=1.4)
    _finish(ax, fontsize=7)


def _finish(ax, fontsize: int = 9) -> None:
    ax.grid(alpha=0.3)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)  # every audit scalar lies in [0, 1]: one scale for all panels
    if ax.lines:
        ax.legend(fontsize=fontsize)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def plot(runs: dict[str, Series], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1 + len(runs), 4, figsize=(22, 3.8 * (1 + len(runs))), squeeze=False)
    for ax, metric in zip(axes[0], OVERALL, strict=True):
        for i, (name, series) in enumerate(runs.items()):
            if series.get(metric):
                steps, values = zip(*series[metric], strict=True)
                ax.plot(steps, values, label=f"run {name}", color=f"C{i}", linewidth=1.6)
        ax.set_title(metric)
        _finish(ax)
    for row, (name, series) in zip(axes[1:], runs.items(), strict=True):
        _lines(row[0], series, CANARY, [m.rsplit("/", 1)[1] for m in CANARY])
        row[0].set_title(f"run {name}: canaries vs real episodes (mean score)")
        for ax, field in zip(row[1:3], ("auroc", "best_threshold"), strict=True):
            tags = sorted((t for t in series if (m := PER_TASK.match(t)) and m.group(2) == field), key=_task_order)
            _lines(ax, series, tags, [PER_TASK.match(t).group(1) for t in tags])
            ax.set_title(f"run {name}: {field} per task")
        score_tags = ("env/vlm_audit/score_success", "env/vlm_audit/score_failure", "env/vlm_audit/best_threshold")
        _lines(row[3], series, score_tags, ["score_success", "score_failure", "best_threshold"])
        row[3].set_title(f"run {name}: mean scores by LIBERO's flag")
    fig.suptitle("Judge audit against LIBERO's success flag (logged only, never a reward)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def _task_order(tag: str) -> tuple[int, str]:
    match = re.search(r"/task(\d+)/", tag)
    return (int(match.group(1)), tag) if match else (10**6, tag)


def write(run_dirs: dict[str, Path], out: Path) -> Path | None:
    """OUT-audit.png and OUT-audit.csv for the runs that log the audit; None if none does."""
    runs: dict[str, Series] = {}
    for name, run_dir in run_dirs.items():
        tags = audit_tags(run_dir)
        if tags:
            runs[name] = read_scalars(run_dir, tags)
        else:
            logger.info("run %s logs no judge audit (env/vlm_audit/*)", name)
    if not runs:
        return None
    png = out.parent / f"{out.name}-audit.png"
    with open(png.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "metric", "step", "value"])
        for name, series in runs.items():
            for metric, points in sorted(series.items()):
                writer.writerows([name, metric, step, value] for step, value in points)
    plot(runs, png)
    return png
