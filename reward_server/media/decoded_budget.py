"""One budget for decoded frames, whatever carried them (--max-decoded-mb).

A request of a few hundred bytes can name a video that decodes to gigabytes, so body bytes and
episode counts do not bound the server's memory; decoded pixels do. Every episode's decoded
size (frames x height x width x 3 after the resize, known before decoding: from a raw batch's
header, an inline array's shape, or a probe of the video's stream) is taken from this budget
before its frames are made and given back when its answer is done (one share for all of an
episode's camera views, taken at once: an episode never holds part of its size while it waits
for the rest, which deadlocked episodes of several views). An episode larger than the
whole budget can never fit: 413 naming the budget and the flag. One that does not fit now waits
its turn, first come first served (a large episode is not starved by small ones), within its
request's deadline (504 past it, which the client retries).

A chat request's images and video (OpenAI's route) are taken from the same budget, as one
share per request, sized from their headers in a decode worker before they are decoded
(images.probe_chat_media) and held until the request's answer is done.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import os
from collections.abc import Callable

from reward_protocol.frames import FrameError, FrameSpec
from reward_server.request_errors import FieldError

logger = logging.getLogger(__name__)

MB = 1024 * 1024
EPISODE_ADVICE = "send fewer frames (nframes) or smaller ones (max_pixels)"


class DecodedTooLarge(FieldError, ValueError):
    """One episode's decoded frames exceed the whole decoded-memory budget; resending cannot help."""


def default_budget_mb() -> float:
    """A quarter of the machine's memory: the engine, the bodies and the decode workers need the rest."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB / 4


def decoded_bytes(frames: int, height: int, width: int, nframes: int, max_pixels: int, spec: FrameSpec) -> int:
    """Bytes of the model-ready frames of a [frames, height, width, 3] episode; 0 when the shape is
    one the spec refuses (preparing it raises the error the client sees)."""
    try:
        count = len(spec.pick_steps(frames, nframes))
        h, w = spec.fit_size(height, width, max_pixels)
    except FrameError:
        return 0
    return count * h * w * 3


class Lease:
    """Bytes taken from the budget; given back once (release() may be called again)."""

    def __init__(self, budget: DecodedBudget, nbytes: int):
        self._budget = budget
        self.nbytes = nbytes

    def release(self) -> None:
        if self.nbytes:
            self._budget._give(self.nbytes)
            self.nbytes = 0

    def hold_until_task_ends(self) -> None:
        """Give the bytes back when the current task ends: the episode's task, which holds its
        frames until its answer is built (or it is cancelled or fails)."""
        task = asyncio.current_task()
        if task is None:
            self.release()
            return
        task.add_done_callback(lambda _: self.release())


class DecodedBudget:
    def __init__(self, max_mb: float, on_release: Callable[[int], None] | None = None):
        self.max_bytes = int(max_mb * MB)
        self._on_release = on_release  # told how many bytes each release gave back (memory_release.py)
        self.in_use = 0
        self.peak = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def as_dict(self) -> dict[str, float]:
        """The /stats keys (MB = MiB, as --max-decoded-mb)."""
        return {
            "decoded_mb_in_use": round(self.in_use / MB, 3),
            "decoded_mb_budget": round(self.max_bytes / MB, 3),
            "decoded_mb_peak": round(self.peak / MB, 3),
        }

    def _grant(self, nbytes: int) -> None:
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)

    async def take(self, nbytes: int, what: str = "this episode", advice: str = EPISODE_ADVICE) -> Lease:
        """Wait until nbytes fit (first come, first served); cancelling the wait takes nothing."""
        if nbytes > self.max_bytes:
            need, have = math.ceil(nbytes / MB), self.max_bytes // MB
            raise DecodedTooLarge(
                f"{what} decodes to {need} MB of frames, more than this server's whole decoded-memory "
                f"budget of {have} MB (--max-decoded-mb); {advice}"
            )
        if not self._waiters and self.in_use + nbytes <= self.max_bytes:
            self._grant(nbytes)
            return Lease(self, nbytes)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, waiter))
        logger.debug("decoded budget: %d bytes wait (%d of %d in use)", nbytes, self.in_use, self.max_bytes)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._give(nbytes)  # granted just as the wait was cancelled
            else:
                # a cancelled wait may already be off the queue: another waiter's cancellation ran
                # _wake first, which drops cancelled waiters it reaches (a batch's deadline cancels
                # all its waiting episodes at once: this was a ValueError, a 500, per episode)
                if (nbytes, waiter) in self._waiters:
                    self._waiters.remove((nbytes, waiter))
                self._wake()  # the next in line may fit now
            raise
        return Lease(self, nbytes)

    def _give(self, nbytes: int) -> None:
        self.in_use -= nbytes
        self._wake()
        if self._on_release is not None:
            self._on_release(nbytes)

    def _wake(self) -> None:
        while self._waiters:
            nbytes, waiter = self._waiters[0]
            if self.in_use + nbytes > self.max_bytes:
                return
            self._waiters.popleft()
            if not waiter.done():
                self._grant(nbytes)
                waiter.set_result(None)
