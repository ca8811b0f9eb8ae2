"""Progress curves: where each point of a curve ends, and the rewards a curve stands for.

A request with `progress_points: K` asks the judge for K progress values, one per prefix of the
frames the model sees (T of them, after the server's normalization). The one rule both sides
use: point k (1..K) covers frames [0, ceil(k*T/K)), so the last point covers the whole episode
and the points are spread as evenly as whole frames allow. The server lays its prompts out by
it (reward_server.profiles) and the RLinf hook places each point's reward at the env step of
that prefix's last frame. Numpy-free and import-light: it runs inside RL env workers.
"""

from __future__ import annotations

from collections.abc import Sequence


class ProgressPointsError(ValueError):
    """A curve of this many points cannot be drawn over these frames; the message says the range."""


def check_points(points: int, frames: int, limit: int | None = None) -> None:
    """Raise ProgressPointsError unless 1 <= points <= frames (and <= limit, a server's own bound)."""
    top = frames if limit is None else min(frames, limit)
    if not 1 <= points <= top:
        why = f"the {frames} frames the model sees" if top == frames else f"this server's --max-progress-points {limit}"
        raise ProgressPointsError(f"progress_points {points} is out of range: allowed 1..{top} ({why})")


def prefix_ends(frames: int, points: int) -> list[int]:
    """For each point k = 1..points, the number of frames its prefix covers: ceil(k*frames/points).

    Strictly increasing when points <= frames, the last equal to frames."""
    check_points(points, frames)
    return [-(-k * frames // points) for k in range(1, points + 1)]


def gains(curve: Sequence[float | None]) -> list[float]:
    """Progress gained at each point since the previous one (the first since 0); a point without a
    value gains nothing and the next valued point takes the difference to the last valued one, so
    the gains always sum to the last valued point (0 if none)."""
    out, previous = [], 0.0
    for value in curve:
        if value is None:
            out.append(0.0)
            continue
        out.append(value - previous)
        previous = value
    return out


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def value_order_correlation(curve: Sequence[float | None]) -> float | None:
    """VOC (TOPReward's metric): Spearman's rank correlation between a curve's values and their
    order in time, over the points that have a value. 1: the curve only rises; -1: only falls;
    None where it is undefined (fewer than two values, or all equal)."""
    points = [(t, v) for t, v in enumerate(curve) if v is not None]
    if len(points) < 2:
        return None
    time_ranks = _ranks([float(t) for t, _ in points])
    value_ranks = _ranks([v for _, v in points])
    n = len(points)
    mean = (n + 1) / 2
    cov = sum((a - mean) * (b - mean) for a, b in zip(time_ranks, value_ranks, strict=True))
    var_v = sum((b - mean) ** 2 for b in value_ranks)
    var_t = sum((a - mean) ** 2 for a in time_ranks)
    if var_v == 0:
        return None
    return cov / (var_t * var_v) ** 0.5


__all__ = ["ProgressPointsError", "check_points", "gains", "prefix_ends", "value_order_correlation"]
