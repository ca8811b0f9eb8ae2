"""Labeled frames written as the datasets RLinf's reward-model trainers read.

- RLinf main: `train.pt` / `val.pt`, each a torch-saved dict `{"images": [uint8 [H, W, 3]
  tensors], "labels": [0/1 ints], "metadata": {...}}` (the `RewardDatasetPayload` layout that
  `examples/reward/train_reward_model.py` loads). The split and sampling follow RLinf's
  `examples/reward/preprocess_reward_dataset.py` option for option and draw for draw (same seed,
  same labels: same files): frames sampled per episode (`num_samples_per_episode`, 0 = all;
  `keep_last_frame`), episodes shuffled and split (`val_split`, at least one validation episode),
  then per split every success frame and `fail_success_ratio` x as many failure frames, drawn at
  random, shuffled together. A split without success frames is empty, as there.
- The earlier form (RLinf pull request 301): `positive/` and `negative/` directories of
  `NNNNNN.npy` files, `{"images": {key: float32 [T, C, H, W]}, "labels": float32 [T]}`; an
  episode with any frame labeled success is positive.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitOptions:
    """RLinf's preprocessing options, with its command line's defaults."""

    num_samples_per_episode: int = 0
    keep_last_frame: bool = True
    val_split: float = 0.2
    fail_success_ratio: float = 2.0
    seed: int | None = 42


def sample_indices(n: int, k: int, keep_last: bool) -> list[int]:
    """The frames of an n-frame episode kept when k are wanted (k <= 0 or k >= n: all)."""
    if k <= 0 or n <= k:
        return list(range(n))
    if k == 1:
        return [n - 1]
    if not keep_last:
        return sorted({int(i * (n - 1) / (k - 1)) for i in range(k)})
    # one slot for the last frame, the others spread over the frames before it
    slots, before = k - 1, n - 1
    if slots >= before:
        picked = list(range(before))
    elif slots == 1:
        picked = [0]
    else:
        picked = [int(i * (before - 1) / (slots - 1)) for i in range(slots)]
    return sorted(set(picked) | {n - 1})


@dataclass
class SplitSet:
    images: list[Any]
    labels: list[int]
    episodes: int
    raw_success: int
    raw_fail: int


def _balance(episodes: Sequence[tuple[Sequence[Any], Sequence[int]]], ratio: float, rng) -> SplitSet:
    success = [img for imgs, labels in episodes for img, lbl in zip(imgs, labels, strict=True) if lbl == 1]
    fail = [img for imgs, labels in episodes for img, lbl in zip(imgs, labels, strict=True) if lbl != 1]
    raw = (len(success), len(fail))
    if not success:
        return SplitSet([], [], len(episodes), *raw)
    rng.shuffle(fail)
    fail = fail[: int(len(success) * ratio)]
    pairs = [(img, 1) for img in success] + [(img, 0) for img in fail]
    rng.shuffle(pairs)
    return SplitSet([p[0] for p in pairs], [p[1] for p in pairs], len(episodes), *raw)


def split_by_episode(
    episodes: Sequence[tuple[Sequence[Any], Sequence[int]]], options: SplitOptions
) -> tuple[SplitSet, SplitSet]:
    """(train, val) from per-episode (images, labels), episodes in the order RLinf's preprocessing
    reads them (its sorted file list)."""
    if not episodes:
        raise ValueError("no labeled episodes to split")
    rng = random.Random(options.seed) if options.seed is not None else random.Random()
    order = list(episodes)
    rng.shuffle(order)
    val_count = max(1, int(len(order) * options.val_split))
    val, train = order[:val_count], order[val_count:]
    train_set = _balance(train, options.fail_success_ratio, rng)
    val_set = _balance(val, options.fail_success_ratio, rng)
    for name, part in (("train", train_set), ("val", val_set)):
        if not part.raw_success:
            logger.warning("the %s split (%d episodes) has no success frame: it is empty", name, part.episodes)
    return train_set, val_set


def write_rlinf_splits(
    out: Path,
    episodes: Sequence[tuple[Sequence[np.ndarray], Sequence[int]]],
    options: SplitOptions,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """Write out/train.pt and out/val.pt; the metadata written (with the sample counts) is returned."""
    import torch  # the dataset format is torch's; only this writer needs it

    as_tensors = [([torch.from_numpy(np.ascontiguousarray(f)) for f in imgs], labels) for imgs, labels in episodes]
    train, val = split_by_episode(as_tensors, options)
    meta = {
        **metadata,
        "num_samples_per_episode": options.num_samples_per_episode,
        "keep_last_frame": options.keep_last_frame,
        "val_split": options.val_split,
        "fail_success_ratio": options.fail_success_ratio,
        "random_seed": options.seed,
        "num_train_samples": len(train.images),
        "num_val_samples": len(val.images),
        "num_train_episodes": train.episodes,
        "num_val_episodes": val.episodes,
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", train), ("val", val)):
        tmp = out / f".{name}.pt.tmp"
        torch.save({"images": part.images, "labels": [int(v) for v in part.labels], "metadata": meta}, tmp)
        tmp.replace(out / f"{name}.pt")  # never a half-written file under the final name
    return meta


def write_pr301_dirs(out: Path, episodes: Sequence[tuple[dict[str, np.ndarray], np.ndarray]]) -> dict[str, int]:
    """Write out/positive and out/negative (episodes as (images dict, frame labels)); counts."""
    counts = {"positive": 0, "negative": 0}
    for kind in counts:
        (out / kind).mkdir(parents=True, exist_ok=True)
    for images, labels in episodes:
        kind = "positive" if np.any(labels) else "negative"
        path = out / kind / f"{counts[kind]:06d}.npy"
        with open(path, "wb") as f:
            np.save(f, {"images": images, "labels": np.asarray(labels, dtype=np.float32)}, allow_pickle=True)
        counts[kind] += 1
    return counts


def pr301_images(frames: np.ndarray, key: str) -> dict[str, np.ndarray]:
    """Frames uint8 [T, H, W, 3] as the earlier form stores them: {key: float32 [T, C, H, W] in [0, 1]}."""
    return {key: frames.transpose(0, 3, 1, 2).astype(np.float32) / 255.0}


__all__ = [
    "SplitOptions",
    "SplitSet",
    "pr301_images",
    "sample_indices",
    "split_by_episode",
    "write_pr301_dirs",
    "write_rlinf_splits",
]
