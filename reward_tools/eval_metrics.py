"""Metrics of a judge against labeled episodes (pure functions, numpy only)."""

from __future__ import annotations

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
    index = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, bins - 1)
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
