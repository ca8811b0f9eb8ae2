"""Episodes the tests send, and the audit's numbers worked out by hand."""

from __future__ import annotations

import numpy as np

from reward_client.protocol import InlineFrames


def episode_frames(steps: int = 24, size: int = 64, seed: int = 0) -> np.ndarray:
    """Frames that change over the episode (a block moving across a noisy background)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 60, size=(steps, size, size, 3), dtype=np.uint8)
    for t in range(steps):
        x = int((size - 12) * t / max(1, steps - 1))
        frames[t, 20:32, x : x + 12] = (220, 40, 40)
    return frames


def inline(frames: np.ndarray) -> dict:
    return InlineFrames.from_array(frames).model_dump(mode="json")


TASK = "put the black bowl on the plate"


def score_body(frames: np.ndarray | None = None, **extra) -> dict:
    """A /score body: TASK and inline frames (8 steps of episode_frames unless given)."""
    return {"task_text": TASK, "frames": inline(episode_frames(8) if frames is None else frames), **extra}


def audit_by_hand(scores: list[float], labels: list[bool], threshold: float) -> dict[str, float]:
    """The audit's numbers for a handful of episodes, computed the long way."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    bins: dict[int, list[tuple[float, bool]]] = {}
    for s, y in zip(scores, labels, strict=True):
        bins.setdefault(min(int(s * 10), 9), []).append((s, y))
    ece = sum(
        len(b) / len(scores) * abs(sum(s for s, _ in b) / len(b) - sum(y for _, y in b) / len(b)) for b in bins.values()
    )

    def quality(t: float) -> tuple[float, float, float]:
        tp = sum(s >= t for s in pos)
        fp = sum(s >= t for s in neg)
        acc = (tp + sum(s < t for s in neg)) / len(scores)
        f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if tp else 0.0
        return acc, f1, -t

    return {
        "episodes": len(scores),
        "auroc": wins / (len(pos) * len(neg)),
        "fpr": sum(s >= threshold for s in neg) / len(neg),
        "fnr": sum(s < threshold for s in pos) / len(pos),
        "ece": ece,
        "score_success": sum(pos) / len(pos),
        "score_failure": sum(neg) / len(neg),
        "best_threshold": max(scores, key=quality),
    }
