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


__all__ = ["ProgressPointsError", "check_points", "gains", "prefix_ends"]
