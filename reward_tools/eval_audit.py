"""Canary probes and per-task numbers for the offline judge evaluation (python -m reward_tools.evaluate).

The same probes and the same metric code as the live audit in RLinf's env (reward_client.rlinf.canary,
reward_client.judge_metrics), so a judge's offline report and its training-time TensorBoard
scalars mean the same thing. Probes are made from the frames the server would sample from each
episode's video (first and last included) and sent inline, each as many frames as it holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from reward_client.client import RewardClient
from reward_client.judge_metrics import mean_or_none, summarize_by_group
from reward_client.rlinf.canary import CANARY_KINDS, CanaryPlanner, Probe
from reward_protocol.score import BackendKwargs, InlineFrames, ScoreRequest
from reward_server.media.video import decode_frames

logger = logging.getLogger("reward_tools.evaluate")


def build_probes(episodes: Sequence[Any], nframes: int, fraction: float, seed: int = 0) -> list[Probe]:
    """Probes for `fraction` of the episodes (every kind each); wrong_task draws from the manifest's tasks."""
    if fraction <= 0:
        return []
    planner = CanaryPlanner(fraction, CANARY_KINDS, [e.task for e in episodes], seed)
    chosen = [int(i) for i in planner.selector.select(len(episodes))]
    frames = []
    for i in chosen:  # only the chosen videos are decoded
        with open(episodes[i].video, "rb") as fh:  # the frames the server would pick from this video
            frames.append(decode_frames(fh, nframes))
    probes = planner.probes_for(
        chosen, [episodes[i].task for i in chosen], frames, room=len(chosen) * len(CANARY_KINDS)
    )
    if planner.skipped:
        logger.info("canaries: %d probes not made (wrong_task needs a manifest with two tasks)", planner.skipped)
    return probes


def score_probes(
    client: RewardClient, probes: list[Probe], score_mode: str | None, batch_size: int
) -> list[float | None]:
    scores: list[float | None] = []
    for start in range(0, len(probes), batch_size):
        requests = [
            ScoreRequest(
                task_text=p.task,
                frames=InlineFrames.from_array(p.frames),
                nframes=len(p.frames),
                request_id=p.request_id,
                backend_kwargs=BackendKwargs(score_mode=score_mode),
            )
            for p in probes[start : start + batch_size]
        ]
        scores += [item.response.score if item.response else None for item in client.score_batch(requests)]
    return scores


def audit_report(
    scores: Sequence[float | None],
    labels: Sequence[bool],
    tasks: Sequence[str],
    threshold: float,
    probes: Sequence[Probe],
    probe_scores: Sequence[float | None],
) -> dict:
    """`tasks`: the live audit's numbers per task; `canary`: mean probe score per kind beside the
    real episodes' by label (null where nothing was scored); `scores`: every episode's score."""
    valid = [i for i, s in enumerate(scores) if s is not None]
    s = np.array([scores[i] for i in valid], float)
    y = np.array([labels[i] for i in valid], bool)
    by_task = summarize_by_group(s, y, [tasks[i] for i in valid], threshold)
    canary: dict[str, Any] = {"real_success": mean_or_none(s[y]), "real_failure": mean_or_none(s[~y])}
    for kind in CANARY_KINDS:
        kind_scores = [v for p, v in zip(probes, probe_scores, strict=True) if p.kind == kind]
        scored = [v for v in kind_scores if v is not None]
        canary[kind] = mean_or_none(scored)
        canary[f"{kind}_n"] = len(scored)
        canary[f"{kind}_failed"] = len(kind_scores) - len(scored)
    return {
        "tasks": {task: asdict(summary) for task, summary in by_task.items()},
        "canary": canary,
        "scores": list(scores),  # per manifest row, null where no score came back
    }


def markdown(reports: list[dict], threshold: float) -> list[str]:
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [
        "",
        "## Canaries",
        "",
        "Mean scores of counterfactual episodes that a sound judge scores like failures: the first frame "
        "repeated (`static`), the episode reversed (`reversed`), the real frames with another task's "
        "instruction (`wrong_task`); beside the real episodes' mean by label. n: probes scored.",
        "",
        "| config | real success | real failure | static (n) | reversed (n) | wrong_task (n) |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        c = r["canary"]
        kinds = " | ".join(f"{fmt(c[k])} ({c[f'{k}_n']})" for k in CANARY_KINDS)
        lines.append(f"| {r['config']} | {fmt(c['real_success'])} | {fmt(c['real_failure'])} | {kinds} |")
    for r in reports:
        lines += [
            "",
            f"## {r['config']}: per task",
            "",
            f"| task | episodes | successes | AUROC | FPR@{threshold:g} | FNR@{threshold:g} | ECE "
            "| mean score success | mean score failure | best threshold |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for task, t in r["tasks"].items():
            lines.append(
                f"| {task} | {t['episodes']} | {t['successes']} | {fmt(t['auroc'])} | {fmt(t['fpr'])} "
                f"| {fmt(t['fnr'])} | {fmt(t['ece'])} | {fmt(t['score_success'])} | {fmt(t['score_failure'])} "
                f"| {fmt(t['best_threshold'])} |"
            )
    return lines


def plots(out: Path, reports: list[dict]) -> list[Path]:
    """Per configuration: OUT-<name>-canary.png (mean score per probe kind beside the real ones) and
    OUT-<name>-tasks.png (AUROC and best threshold per task; a missing bar is undefined)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for r in reports:
        name = r["config"].replace("/", "_")
        c = r["canary"]
        bars = ["real_success", "real_failure", *CANARY_KINDS]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        values = [np.nan if c[b] is None else c[b] for b in bars]
        ax.bar(bars, values, color=["C2", "C3", "C0", "C1", "C4"])
        ax.set(title=f"{r['config']}: canaries vs real episodes", ylabel="mean score", ylim=(0, 1))
        fig.tight_layout()
        written.append(out.parent / f"{out.name}-{name}-canary.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

        tasks = list(r["tasks"])
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(tasks) + 2), 3.8))
        x = np.arange(len(tasks))
        for offset, field, color in ((-0.2, "auroc", "C0"), (0.2, "best_threshold", "C1")):
            vals = [np.nan if r["tasks"][t][field] is None else r["tasks"][t][field] for t in tasks]
            ax.bar(x + offset, vals, width=0.4, label=field, color=color)
        ax.set_xticks(x, [t[:28] for t in tasks], rotation=30, ha="right", fontsize=7)
        ax.set(title=f"{r['config']}: per task", ylim=(0, 1))
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out.parent / f"{out.name}-{name}-tasks.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
