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

Pickles run code: unpickling calls whatever a file names. So episode files are read with a
restricted unpickler (reward_tools.episode_unpickler: numpy arrays, dtypes and scalars, torch
CPU tensors, plain containers and scalars, which is all these two forms hold), and a file naming
anything else is refused unread; `trust_pickles` reads them with plain `pickle` (np.load with
allow_pickle) for files you wrote yourself. Only regular files are opened (a FIFO or a device
named `.pkl` is named, not read), each read once, never past the size it had when opened, and
hashed as it is read (SHA-256: the journal knows an episode by its content).

Frames follow one rule for the whole episode (reward_protocol.frames.as_uint8 on the episode's
stacked frames): uint8 as they are, integers in 0..255 as uint8, floats in [0, 1] as
round(x * 255); anything else refuses the episode, naming the dtype and the range found.

A file that cannot be read as an episode raises BrokenEpisode naming it and what was wrong; the
caller reports it and goes on.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from reward_protocol.frames import FrameError, as_uint8
from reward_tools import episode_unpickler

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
    nbytes: int = 0  # the file's size
    digest: str = ""  # SHA-256 of the file's bytes (the journal's key: a re-collected file is judged again)
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


_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
}


class EpisodeBytes:
    """One episode file read once, front to back, as a file object for the unpickler: a regular
    file only (a FIFO's open waits for a writer and a device's read never ends), never more bytes
    than it had when opened, its SHA-256 digest computed as the bytes pass (SHA-256, not blake2b:
    with the SHA extensions most x86 CPUs have it hashes 2.5 MB in 1.5 ms where blake2b takes 6.6)."""

    def __init__(self, path: Path, name: str):
        self.name = name
        try:  # O_NONBLOCK: a FIFO's open returns at once instead of waiting for a writer
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise BrokenEpisode(name, f"cannot be opened ({exc.strerror})") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            kind = _FILE_KINDS.get(stat.S_IFMT(info.st_mode), "not a file")
            raise BrokenEpisode(name, f"is not a regular file ({kind}): only regular files are read")
        self._file = os.fdopen(fd, "rb")
        self.size = self.left = info.st_size
        self._hash = hashlib.sha256()

    def read(self, n: int | None = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self._file.read(n)
        self.left -= len(data)
        self._hash.update(data)
        return data

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")[: self.left]
        got = self._file.readinto(view) or 0
        self.left -= got
        self._hash.update(view[:got])
        return got

    def readline(self, size: int | None = -1) -> bytes:
        line = self._file.readline(self.left if size is None or size < 0 else min(size, self.left))
        self.left -= len(line)
        self._hash.update(line)
        return line

    def digest(self) -> str:
        """The whole file's digest (what the reader left is read and hashed first); a file that
        grew while it was read is refused (still being written)."""
        while self.read(1 << 20):
            pass
        if self._file.read(1):
            raise BrokenEpisode(self.name, "grew while it was read (still being written?): run again once complete")
        return self._hash.hexdigest()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> EpisodeBytes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unpickle(reader: EpisodeBytes, trust_pickles: bool) -> Any:
    """One object from the reader: restricted (episode_unpickler) unless trust_pickles."""
    try:
        return pickle.load(reader) if trust_pickles else episode_unpickler.load(reader)
    except episode_unpickler.PickleRefused as exc:
        raise BrokenEpisode(reader.name, f"refused: {exc}; {episode_unpickler.REFUSED_ADVICE}") from None
    except BrokenEpisode:
        raise
    except Exception as exc:  # any unpickling failure: truncated, not a pickle, missing class
        raise BrokenEpisode(reader.name, f"cannot be unpickled ({type(exc).__name__}: {exc})") from None


def _load_npy(reader: EpisodeBytes, trust_pickles: bool) -> Any:
    """A `.npy` file's object: its header read here, a pickled (object) array unpickled as any
    episode pickle is (np.load(allow_pickle=True) would run its code), any other array refused."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(reader)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(reader)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(reader)
        else:
            raise ValueError(f"npy format version {version} (1.0 and 2.0 are read)")
    except ValueError as exc:
        raise BrokenEpisode(reader.name, f"is not a .npy file ({exc})") from None
    if not dtype.hasobject:
        raise BrokenEpisode(reader.name, f"holds a {dtype} array {list(shape)}, not a pickled episode dict")
    data = _unpickle(reader, trust_pickles)
    return data.item() if isinstance(data, np.ndarray) and data.size == 1 else data


def _array(value: Any) -> np.ndarray:
    """A numpy view of a torch tensor or array-like (torch is imported only if it is one)."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def to_hwc(image: Any, what: str) -> np.ndarray:
    """One frame as [H, W, 3] (HWC, or CHW transposed), its values untouched: the pixel rule is
    the episode's (episode_uint8), not the frame's."""
    arr = _array(image)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise ValueError(f"{what} has shape {list(arr.shape)}; expected one [H, W, 3] (or [3, H, W]) image")
    if arr.shape[-1] != 3 and arr.shape[0] == 3:
        arr = arr.transpose(1, 2, 0)
    if arr.shape[-1] != 3:
        raise ValueError(f"{what} has shape {list(arr.shape)}; expected 3 colour channels")
    return arr


def episode_uint8(frames: list[np.ndarray], what: str) -> np.ndarray:
    """An episode's frames (HWC, one size) as uint8 [T, H, W, 3] by one rule for all of them
    (as_uint8 on the stack: floats in [0, 1] times 255, decided once, so one pixel a rounding
    past 1.0 refuses the episode instead of leaving its frame near black); integer pixels in
    0..255 are taken as they are."""
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"frames differ in size: {sorted({f.shape for f in frames})}")
    stack = np.stack(frames)
    if stack.dtype != np.uint8 and stack.dtype.kind in "iu" and stack.size and 0 <= stack.min() and stack.max() <= 255:
        return stack.astype(np.uint8)
    try:
        return as_uint8(stack, what)
    except FrameError as exc:
        raise ValueError(str(exc)) from None


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


def read_rlinf_pickle(reader: EpisodeBytes, name: str, trust_pickles: bool = False) -> EpisodeFile:
    """One RLinf main episode pickle; frames are the observations' `main_images` (those of the
    first len(infos) observations that have one, as RLinf's preprocessing takes them)."""
    data = _unpickle(reader, trust_pickles)
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
            frames.append(to_hwc(image, f"observations[{step}]['main_images']"))
            labels.append(sim_frame_label(info))
        if not frames:
            raise BrokenEpisode(name, "has no observation with main_images")
        stack = episode_uint8(frames, "its main_images")
    except ValueError as exc:
        raise BrokenEpisode(name, str(exc)) from None
    success = data.get("success")
    return EpisodeFile(
        name=name,
        frames=stack,
        task=_task(observations),
        sim_labels=np.array(labels, dtype=bool),
        sim_success=None if success is None else _flag(success),
    )


def read_pr301_npy(reader: EpisodeBytes, name: str, image_key: str | None, trust_pickles: bool = False) -> EpisodeFile:
    """One trajectory of the earlier form; its directory (positive/negative) is its label."""
    data = _load_npy(reader, trust_pickles)
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
        layout = [to_hwc(f, f"images[{image_key!r}][{i}]") for i, f in enumerate(stack)]
        frames = episode_uint8(layout, f"its images[{image_key!r}]")
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


def read_episode(
    form: Form, path: Path, root: Path, image_key: str | None = None, trust_pickles: bool = False
) -> EpisodeFile:
    """Read one episode file of the given form; BrokenEpisode if it is not one (or, without
    trust_pickles, if its pickle names anything but arrays, tensors, containers and scalars)."""
    name = path.relative_to(root).as_posix()
    with EpisodeBytes(path, name) as reader:
        if form == "rlinf":
            episode = read_rlinf_pickle(reader, name, trust_pickles)
        else:
            episode = read_pr301_npy(reader, name, image_key, trust_pickles)
        episode.nbytes, episode.digest = reader.size, reader.digest()
    return episode


__all__ = [
    "BrokenEpisode",
    "EpisodeBytes",
    "EpisodeFile",
    "Form",
    "episode_uint8",
    "find_episodes",
    "read_episode",
    "sim_frame_label",
    "to_hwc",
]
