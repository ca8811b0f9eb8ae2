"""Metrics of a judge against labeled episodes (pure functions, numpy only).

One implementation for both places that measure a judge: the live audit inside RLinf's env
(reward_client.rlinf.audit, which may import numpy only) and the offline evaluation tool
(reward_tools.evaluate). A value that is undefined for the episodes given (AUROC with one
class missing, the false-positive rate without failures) is None, never a made-up number.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


def auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve: P(score of a random success > score of a random failure), ties 1/2.
    None when one class is missing."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    pos, neg = scores[labels], scores[~labels]
    if len(pos) == 0 or len(neg) == 0:
        return None
    ranks = _average_ranks(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def roc_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positive rates, true positive rates, thresholds), thresholds descending, from (0, 0)."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    thresholds = np.concatenate([[np.inf], np.unique(scores)[::-1]])
    pos, neg = max(labels.sum(), 1), max((~labels).sum(), 1)
    tpr = np.array([(scores[labels] >= t).sum() / pos for t in thresholds])
    fpr = np.array([(scores[~labels] >= t).sum() / neg for t in thresholds])
    return fpr, tpr, thresholds


@dataclass(frozen=True)
class Classification:
    threshold: float
    accuracy: float
    precision: float
    recall: float
    f1: float


def classify_at(scores: np.ndarray, labels: np.ndarray, threshold: float) -> Classification:
    """Success predicted when score >= threshold."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    pred = scores >= threshold
    tp = int((pred & labels).sum())
    fp = int((pred & ~labels).sum())
    fn = int((~pred & labels).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = float((pred == labels).mean()) if len(labels) else 0.0
    return Classification(float(threshold), accuracy, precision, recall, f1)


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> Classification:
    """The threshold (among the observed scores) with the highest accuracy; ties: highest F1,
    then the lowest threshold."""
    candidates = sorted(set(np.asarray(scores, float).tolist())) or [0.5]
    results = [classify_at(scores, labels, t) for t in candidates]
    return max(results, key=lambda c: (c.accuracy, c.f1, -c.threshold))


@dataclass(frozen=True)
class CalibrationBin:
    low: float
    high: float
    count: int
    mean_score: float | None
    success_rate: float | None


def calibration(scores: np.ndarray, labels: np.ndarray, bins: int = 10) -> tuple[list[CalibrationBin], float]:
    """Equal-width bins over [0, 1] (the last includes 1.0) and the expected calibration error:
    sum over bins of (count / n) * |mean score - success rate|."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    # floor(score * bins), not a search of the float edges: 0.6 belongs to [0.6, 0.7), and
    # linspace's 0.6000000000000001 would put it in the bin below
    index = np.clip(np.floor(scores * bins).astype(int), 0, bins - 1)
    table, ece, n = [], 0.0, max(len(scores), 1)
    for b in range(bins):
        mask = index == b
        count = int(mask.sum())
        mean_score = float(scores[mask].mean()) if count else None
        rate = float(labels[mask].mean()) if count else None
        if count:
            ece += count / n * abs(mean_score - rate)
        table.append(CalibrationBin(float(edges[b]), float(edges[b + 1]), count, mean_score, rate))
    return table, float(ece)


def error_rates(scores: np.ndarray, labels: np.ndarray, threshold: float) -> tuple[float | None, float | None]:
    """(false-positive rate, false-negative rate) when success is predicted at score >= threshold:
    FP / failures and FN / successes, each None when that class is absent."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    pred = scores >= threshold
    failures, successes = int((~labels).sum()), int(labels.sum())
    fpr = float((pred & ~labels).sum() / failures) if failures else None
    fnr = float((~pred & labels).sum() / successes) if successes else None
    return fpr, fnr


def mean_or_none(values: Sequence[float] | np.ndarray) -> float | None:
    values = np.asarray(values, float)
    return float(values.mean()) if len(values) else None


@dataclass(frozen=True)
class JudgeSummary:
    """How a judge did on a set of episodes; None where the set cannot say."""

    episodes: int
    successes: int
    auroc: float | None
    fpr: float | None  # at the threshold summarize_judge was given
    fnr: float | None
    ece: float | None
    score_success: float | None  # mean score of the successful episodes
    score_failure: float | None
    best_threshold: float | None  # best_threshold()'s pick; None unless both classes are present


def summarize_judge(scores: np.ndarray, labels: np.ndarray, threshold: float, bins: int = 10) -> JudgeSummary:
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    both = bool(labels.any() and (~labels).any())
    fpr, fnr = error_rates(scores, labels, threshold)
    return JudgeSummary(
        episodes=len(scores),
        successes=int(labels.sum()),
        auroc=auroc(scores, labels),
        fpr=fpr,
        fnr=fnr,
        ece=calibration(scores, labels, bins)[1] if len(scores) else None,
        score_success=mean_or_none(scores[labels]),
        score_failure=mean_or_none(scores[~labels]),
        # with one class only, any threshold outside the scores is "perfect": nothing to learn
        best_threshold=best_threshold(scores, labels).threshold if both else None,
    )


def summarize_by_group(
    scores: np.ndarray, labels: np.ndarray, groups: Sequence[Hashable], threshold: float
) -> dict[Hashable, JudgeSummary]:
    """summarize_judge per group (e.g. per task), groups in order of first appearance."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    keys = list(dict.fromkeys(groups))
    index = np.array([keys.index(g) for g in groups], dtype=int)
    return {key: summarize_judge(scores[index == i], labels[index == i], threshold) for i, key in enumerate(keys)}


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman rank correlation (average ranks for ties); None if either side is constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2:
        return None
    rx, ry = _average_ranks(x), _average_ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def value_order_correlation(scores: np.ndarray, trajectories: np.ndarray, times: np.ndarray) -> float | None:
    """VOC: for each trajectory, the Spearman correlation between the judge's values and the
    chronological order of its clips; the mean over trajectories with at least two clips."""
    scores, trajectories, times = np.asarray(scores, float), np.asarray(trajectories), np.asarray(times, float)
    values = []
    for traj in np.unique(trajectories):
        mask = trajectories == traj
        if mask.sum() >= 2:
            rho = spearman(scores[mask], times[mask])
            values.append(0.0 if rho is None else rho)
    return float(np.mean(values)) if values else None


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    sorted_vals = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
