"""Episodes the tests send (frames, bodies, a labeled set for the evaluation tool), and the audit's
numbers worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from reward_client.video_io import write_mp4
from reward_protocol.score import InlineFrames


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


def ramp(steps: int, size: int = 56) -> np.ndarray:
    """Frames whose brightness rises over the episode: the fake engine scores the brightness of
    the last frame it sees, so a curve over them rises and its points can be predicted."""
    return np.stack([np.full((size, size, 3), round(255 * t / max(1, steps - 1)), np.uint8) for t in range(steps)])


LABELED_TASKS = ("put the bowl on the plate", "open the top drawer")


def write_labeled_set(directory: Path) -> Path:
    """Eight labeled episodes as MP4s and the manifest the evaluation tool reads: two tasks, each
    with two successes (a visibly different ending) and two failures."""
    rows = []
    for i in range(8):
        success = i % 2 == 0
        frames = episode_frames(12, seed=i)
        if success:
            frames[-4:, :, :] = (40, 200, 40)  # a visibly different ending
        path = write_mp4(frames, directory / f"ep{i}.mp4")
        rows.append(
            {
                "video": path.split("/")[-1],
                "task": LABELED_TASKS[i // 4],  # two tasks, each with two successes and two failures
                "success": int(success),
                "progress": 100 if success else 10 * i,
                "trajectory": f"traj{i % 2}",
                "t": i // 2,
            }
        )
    manifest = directory / "manifest.jsonl"
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return directory
