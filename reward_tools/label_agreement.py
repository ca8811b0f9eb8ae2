"""How the judge's labels agree with the simulator's, on the episodes that carry both.

Episodes: the judge's verdict (some frame labeled success) against the simulator's episode label
(the pickle's `success`; the earlier form's positive/negative directory), as a confusion matrix
and accuracy, plus the AUC of the raw episode score (reward_client.judge_metrics: the
probability that a random success scores above a random failure, whatever the threshold) and the
threshold that would have agreed best. Frames: the judge's frame labels against the simulator's
per-frame success (the flag RLinf's preprocessing reads), over every frame of those episodes.
All of it overall and per task. A number the episodes cannot give (AUC with one class) is null.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reward_client.judge_metrics import summarize_judge


@dataclass
class Judged:
    """One labeled episode as the report needs it."""

    name: str
    task: str
    score: float
    judge_labels: np.ndarray  # bool [T]
    sim_labels: np.ndarray | None  # bool [T]
    sim_success: bool | None


def confusion(predicted: np.ndarray, actual: np.ndarray) -> dict:
    """Counts with the simulator as truth and success as the positive class, and accuracy."""
    predicted, actual = np.asarray(predicted, bool), np.asarray(actual, bool)
    counts = {
        "true_success": int((predicted & actual).sum()),
        "false_success": int((predicted & ~actual).sum()),
        "false_failure": int((~predicted & actual).sum()),
        "true_failure": int((~predicted & ~actual).sum()),
    }
    counts["accuracy"] = float((predicted == actual).mean()) if len(actual) else None
    return counts


def _block(episodes: Sequence[Judged], threshold: float) -> dict:
    with_sim = [e for e in episodes if e.sim_success is not None]
    block: dict = {
        "episodes": len(episodes),
        "judged_success": sum(bool(e.judge_labels.any()) for e in episodes),
        "frames": int(sum(len(e.judge_labels) for e in episodes)),
        "frames_judged_success": int(sum(e.judge_labels.sum() for e in episodes)),
        "compared_episodes": len(with_sim),
    }
    if with_sim:
        scores = np.array([e.score for e in with_sim], dtype=float)
        actual = np.array([e.sim_success for e in with_sim], dtype=bool)
        predicted = np.array([e.judge_labels.any() for e in with_sim], dtype=bool)
        summary = summarize_judge(scores, actual, threshold)
        block["episode"] = {
            **confusion(predicted, actual),
            "sim_success": int(actual.sum()),
            "auc": summary.auroc,
            "best_threshold": summary.best_threshold,
            "score_success": summary.score_success,
            "score_failure": summary.score_failure,
        }
    framed = [e for e in episodes if e.sim_labels is not None]
    if framed:
        block["frame"] = confusion(
            np.concatenate([e.judge_labels for e in framed]), np.concatenate([e.sim_labels for e in framed])
        )
    return block


def agreement_report(
    episodes: Sequence[Judged], threshold: float, skipped: dict[str, list[dict]], judge: dict, rule: dict
) -> dict:
    """The report as a JSON-ready dict: the judge and rule, overall and per-task agreement, and
    every episode that is not in the dataset with the reason."""
    tasks = list(dict.fromkeys(e.task for e in episodes))
    return {
        "judge": judge,
        "rule": rule,
        "overall": _block(episodes, threshold),
        "per_task": {t: _block([e for e in episodes if e.task == t], threshold) for t in tasks},
        "skipped": skipped,
    }


def summary_lines(report: dict) -> list[str]:
    """A few lines for a person: what was labeled and how it agreed."""
    o = report["overall"]
    lines = [
        f"labeled {o['episodes']} episodes ({o['judged_success']} judged successful), "
        f"{o['frames_judged_success']} of {o['frames']} frames success"
    ]
    ep, fr = o.get("episode"), o.get("frame")
    if ep:
        auc = "n/a" if ep["auc"] is None else f"{ep['auc']:.3f}"
        lines.append(
            f"vs simulator, episodes: accuracy {ep['accuracy']:.3f}, AUC {auc} "
            f"(true/false success {ep['true_success']}/{ep['false_success']}, "
            f"true/false failure {ep['true_failure']}/{ep['false_failure']})"
        )
    if fr:
        lines.append(f"vs simulator, frames: accuracy {fr['accuracy']:.3f}")
    for reason, items in report["skipped"].items():
        if items:
            lines.append(f"skipped ({reason}): {len(items)}: " + ", ".join(i["name"] for i in items[:10]))
    return lines


__all__ = ["Judged", "agreement_report", "confusion", "summary_lines"]
