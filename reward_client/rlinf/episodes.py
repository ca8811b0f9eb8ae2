"""Per-env episode frame buffers whose memory does not grow with the episode.

An episode's length is unknown until it ends (success can come at any step), yet the judge
wants frames spread evenly over all of it, the last one included (success shows at the end).
Each env keeps every `stride`-th frame in preallocated slots; when the slots fill up, every
other kept frame is dropped and the stride doubles. With n frames wanted, at most 2n frames
are held per env (2n - 1 strided plus the latest), whatever the episode length.
Frames are kept as uint8 by the one pixel rule (reward_protocol.frames.as_uint8): float frames in
[0, 1] become round(x * 255); any other dtype is refused, never cast.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reward_protocol.frames import QWEN2_5_VL, FrameSpec, as_uint8


def even_count(nframes: int, spec: FrameSpec = QWEN2_5_VL) -> int:
    """The frame count a server will use for a request of nframes (Qwen2.5-VL: pairs)."""
    return spec.frame_count(nframes)


class EpisodeBuffer:
    """Frames of one episode; `frames()` picks the steps the server's FrameSpec would pick from
    the whole episode (`FrameSpec.pick_steps`), each replaced by the nearest step still held."""

    def __init__(self, nframes: int, frame_shape: tuple[int, int, int], spec: FrameSpec = QWEN2_5_VL):
        self.spec = spec
        self.nframes = even_count(nframes, spec)
        self.capacity = 2 * self.nframes - 1
        self._slots = np.empty((self.capacity + 1, *frame_shape), dtype=np.uint8)  # last slot: latest frame
        self._latest = self.capacity
        self.clear()

    def clear(self) -> None:
        self.length = 0  # frames seen in this episode
        self.stride = 1
        self._kept: list[tuple[int, int]] = []  # (step, slot), in step order
        self._free = list(range(self.capacity))

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self._slots.shape[1:]

    @property
    def nbytes(self) -> int:
        return self._slots.nbytes

    def append(self, frame: np.ndarray) -> None:
        frame = as_uint8(frame, "env frames")  # a slot assignment would cast silently (0.5 -> 0)
        step = self.length
        self.length += 1
        self._slots[self._latest] = frame
        if step % self.stride:
            return
        if not self._free:
            dropped = self._kept[1::2]
            self._kept = self._kept[::2]
            self._free.extend(slot for _, slot in dropped)
            self.stride *= 2
            if step % self.stride:
                return
        slot = self._free.pop()
        self._slots[slot] = frame
        self._kept.append((step, slot))

    def _chosen(self) -> list[tuple[int, int]]:
        if self.length == 0:
            raise ValueError("no frames were recorded in this episode")
        last = self.length - 1
        candidates = list(self._kept)
        if candidates[-1][0] != last:
            candidates.append((last, self._latest))
        if len(candidates) <= self.nframes:
            return candidates
        steps = np.array([step for step, _ in candidates])
        picks = {int(np.abs(steps - t).argmin()) for t in self.spec.pick_steps(self.length, self.nframes)}
        return [candidates[i] for i in sorted(picks)]

    def frames(self) -> np.ndarray:
        """Up to `nframes` frames spread evenly over the episode, first and last included (a copy)."""
        return self._slots[[slot for _, slot in self._chosen()]].copy()

    def steps(self) -> list[int]:
        """The episode steps that `frames()` returns (for logs and tests)."""
        return [step for step, _ in self._chosen()]


class EpisodeBuffers:
    """One EpisodeBuffer per env, created on an episode's first frame (the frame size is known
    then). A frame of another size later in the episode is not recorded: the episode is marked
    (`error`), so it is not judged on the frames that remain (each of them would be lost silently)."""

    def __init__(self, num_envs: int, nframes: int, spec: FrameSpec = QWEN2_5_VL, what: str = "frames"):
        self.num_envs = num_envs
        self.nframes = nframes
        self.spec = spec
        self.what = what  # named in the error (a camera's label)
        self._buffers: list[EpisodeBuffer | None] = [None] * num_envs
        self._errors: dict[int, str] = {}  # env -> why its current episode cannot be judged as recorded

    def start(self, env_ids: Sequence[int], first_frames: np.ndarray) -> None:
        """New episodes for env_ids; first_frames[i] is env_ids[i]'s first observation."""
        for env, frame in zip(env_ids, first_frames, strict=True):
            env = int(env)
            buf = self._buffers[env]
            if buf is None or buf.frame_shape != frame.shape:
                buf = self._buffers[env] = EpisodeBuffer(self.nframes, frame.shape, self.spec)
            buf.clear()
            buf.append(frame)
            self._errors.pop(env, None)

    def append(self, frames: np.ndarray, active: np.ndarray) -> None:
        """Add this step's frame [num_envs, H, W, 3] for every env whose episode is still running."""
        for env in np.flatnonzero(active):
            env = int(env)
            buf, frame = self._buffers[env], frames[env]
            if buf is None:
                buf = self._buffers[env] = EpisodeBuffer(self.nframes, frame.shape, self.spec)
            elif buf.length and buf.frame_shape != frame.shape:
                self.mark(
                    env,
                    f"its {self.what} changed size mid-episode, {list(buf.frame_shape)} to {list(frame.shape)} "
                    f"at step {buf.length}",
                )
                continue
            buf.append(frame)

    def mark(self, env: int, why: str) -> None:
        """env's current episode cannot be judged as recorded (the first reason is kept)."""
        self._errors.setdefault(env, why)

    def error(self, env: int) -> str | None:
        """Why env's current episode cannot be judged as recorded, or None."""
        return self._errors.get(env)

    def frames(self, env: int) -> np.ndarray:
        buf = self._buffers[env]
        if buf is None:
            raise ValueError(f"env {env} has recorded no frames")
        return buf.frames()

    def steps(self, env: int) -> list[int]:
        """The episode steps `frames(env)` returns."""
        buf = self._buffers[env]
        return [] if buf is None else buf.steps()

    def length(self, env: int) -> int:
        buf = self._buffers[env]
        return 0 if buf is None else buf.length

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers if b is not None)
