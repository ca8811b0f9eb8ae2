"""Collected episodes on disk, read for labeling: RLinf main's episode pickles and the earlier
form's `.npy` trajectories, as one `EpisodeFile` each (frames, task, the simulator's labels).

RLinf main (`env.<split>.data_collection`, its `CollectEpisode` wrapper) writes one pickle per
episode, `rank_R_env_I_episode_K_step_S_{success|fail}.pkl`: a dict with `success`,
`observations` (per-step obs dicts, the first the reset observation), `actions`, `rewards`,
`terminated`, `truncated` and `infos` (state-aligned with `observations`). A frame is an
observation's `main_images` ([H, W, 3], a torch tensor or an array). The simulator's label of a
frame is read as RLinf's preprocessing reads it: the info's `success` if present, else its
`episode.success_once`, else 0.

The earlier form (RLinf pull request 301's `RewardDataCollector`) writes `positive/` and
`negative/` directories of `NNNNNN.npy` files, each a pickled dict `{"images": {key: float32
[T, C, H, W]}, "labels": float32 [T]}`; the directory is the episode's label, `labels` the frames'.

A file that cannot be read as an episode raises BrokenEpisode naming it and what was wrong; the
caller reports it and goes on.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

Form = Literal["rlinf", "pr301"]
PR301_DIRS = ("positive", "negative")


class BrokenEpisode(ValueError):
    """A file that is not a readable episode; the message names the file and the problem."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass
class EpisodeFile:
    """One episode as read from disk: its frames and what the simulator said about them."""

    name: str  # path relative to the episodes directory (the journal's key)
    frames: np.ndarray  # uint8 [T, H, W, 3]
    task: str | None  # the instruction the episode carries, if any
    sim_labels: np.ndarray | None  # bool [T]: the simulator's per-frame success, if recorded
    sim_success: bool | None  # the simulator's episode label, if recorded
    nbytes: int = 0  # the file's size (the journal checks it has not changed)
    source: dict[str, Any] = field(default_factory=dict)  # pr301: the file's own images dict


def find_episodes(root: Path) -> tuple[Form, list[Path]]:
    """The episode files under root: `*.pkl` in it (RLinf main), else `positive/*.npy` and
    `negative/*.npy` (the earlier form); sorted, so every run sees them in the same order."""
    pickles = sorted(root.glob("*.pkl"))
    if pickles:
        return "rlinf", pickles
    npys = [p for d in PR301_DIRS for p in sorted((root / d).glob("*.npy"))]
    if npys:
        return "pr301", npys
    raise FileNotFoundError(
        f"no episodes under {root}: expected RLinf main's *.pkl files (env.<split>.data_collection) "
        "or the earlier form's positive/*.npy and negative/*.npy"
    )


def _array(value: Any) -> np.ndarray:
    """A numpy view of a torch tensor or array-like (torch is imported only if it is one)."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def to_uint8_hwc(image: Any, what: str) -> np.ndarray:
    """One frame as uint8 [H, W, 3]: HWC or CHW, uint8 or float (in [0, 1] or [0, 255])."""
    arr = _array(image)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise ValueError(f"{what} has shape {list(arr.shape)}; expected one [H, W, 3] (or [3, H, W]) image")
    if arr.shape[-1] != 3 and arr.shape[0] == 3:
        arr = arr.transpose(1, 2, 0)
    if arr.shape[-1] != 3:
        raise ValueError(f"{what} has shape {list(arr.shape)}; expected 3 colour channels")
    if arr.dtype == np.uint8:
        return arr
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{what} has dtype {arr.dtype}; expected uint8 or float pixels")
    arr = arr.astype(np.float32)
    if arr.size and arr.max() <= 1.0:
        arr = arr * 255.0
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def _flag(value: Any) -> bool:
    return bool(_array(value).any()) if value is not None else False


def sim_frame_label(info: Any) -> bool:
    """The simulator's success for one step's info, read as RLinf's preprocessing reads it."""
    if not isinstance(info, dict):
        return False
    if "success" in info:
        return _flag(info["success"])
    episode = info.get("episode")
    return _flag(episode.get("success_once")) if isinstance(episode, dict) else False


def _task(observations: list) -> str | None:
    for obs in reversed(observations):
        desc = obs.get("task_descriptions") if isinstance(obs, dict) else None
        if isinstance(desc, (list, tuple)):
            desc = desc[0] if desc else None
        if isinstance(desc, str) and desc.strip():
            return desc
    return None


def read_rlinf_pickle(path: Path, name: str) -> EpisodeFile:
    """One RLinf main episode pickle; frames are the observations' `main_images` (those of the
    first len(infos) observations that have one, as RLinf's preprocessing takes them)."""
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except Exception as exc:  # any unpickling failure: truncated, not a pickle, missing class
        raise BrokenEpisode(name, f"cannot be unpickled ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise BrokenEpisode(name, f"holds a {type(data).__name__}, not an episode dict")
    observations, infos = data.get("observations"), data.get("infos")
    if not isinstance(observations, list) or not isinstance(infos, list) or not observations or not infos:
        raise BrokenEpisode(name, "has no observations or no infos (lists of per-step dicts)")
    frames, labels = [], []
    try:
        for step, (obs, info) in enumerate(zip(observations, infos, strict=False)):  # RLinf reads len(infos)
            image = obs.get("main_images") if isinstance(obs, dict) else None
            if image is None:
                continue
            frames.append(to_uint8_hwc(image, f"observations[{step}]['main_images']"))
            labels.append(sim_frame_label(info))
    except ValueError as exc:
        raise BrokenEpisode(name, str(exc)) from None
    if not frames:
        raise BrokenEpisode(name, "has no observation with main_images")
    if len({f.shape for f in frames}) != 1:
        raise BrokenEpisode(name, f"frames differ in size: {sorted({f.shape for f in frames})}")
    success = data.get("success")
    return EpisodeFile(
        name=name,
        frames=np.stack(frames),
        task=_task(observations),
        sim_labels=np.array(labels, dtype=bool),
        sim_success=None if success is None else _flag(success),
    )


def read_pr301_npy(path: Path, name: str, image_key: str | None) -> EpisodeFile:
    """One trajectory of the earlier form; its directory (positive/negative) is its label."""
    try:
        data = np.load(path, allow_pickle=True).item()
    except Exception as exc:
        raise BrokenEpisode(name, f"cannot be loaded as a pickled .npy dict ({type(exc).__name__}: {exc})") from None
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, dict) or not images:
        raise BrokenEpisode(name, "has no 'images' dict of {key: [T, C, H, W]} arrays")
    if image_key is None:
        if len(images) != 1:
            raise BrokenEpisode(name, f"has image keys {sorted(images)}: choose one with --image-key")
        image_key = next(iter(images))
    if image_key not in images:
        raise BrokenEpisode(name, f"has no image key {image_key!r} (it has {sorted(images)})")
    stack = np.asarray(images[image_key])
    if stack.ndim != 4 or len(stack) == 0:
        raise BrokenEpisode(name, f"images[{image_key!r}] has shape {list(stack.shape)}; expected [T, C, H, W]")
    try:
        frames = np.stack([to_uint8_hwc(f, f"images[{image_key!r}][{i}]") for i, f in enumerate(stack)])
    except ValueError as exc:
        raise BrokenEpisode(name, str(exc)) from None
    labels = data.get("labels")
    sim_labels = None
    if labels is not None:
        labels = np.asarray(labels, dtype=np.float32).reshape(-1)
        if len(labels) != len(frames):
            raise BrokenEpisode(name, f"has {len(labels)} labels for {len(frames)} frames")
        sim_labels = labels >= 0.5
    return EpisodeFile(
        name=name,
        frames=frames,
        task=None,
        sim_labels=sim_labels,
        sim_success=Path(name).parts[0] == "positive",
        source={"images": images},
    )


def read_episode(form: Form, path: Path, root: Path, image_key: str | None = None) -> EpisodeFile:
    """Read one episode file of the given form; BrokenEpisode if it is not one."""
    name = path.relative_to(root).as_posix()
    episode = read_rlinf_pickle(path, name) if form == "rlinf" else read_pr301_npy(path, name, image_key)
    episode.nbytes = path.stat().st_size
    return episode


__all__ = ["BrokenEpisode", "EpisodeFile", "Form", "find_episodes", "read_episode", "sim_frame_label", "to_uint8_hwc"]
