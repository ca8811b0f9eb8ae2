"""Frames that only the cycle collector can free, and a way to see that it did (the reclaimer's tests)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np


def frames_in_a_cycle(nbytes: int) -> weakref.ref:
    """Frames kept alive only by a reference cycle (as an exception's traceback keeps the frames of
    its locals); returns a weak reference that dies when a collection frees them."""
    frames = np.zeros(nbytes, np.uint8)
    ref = weakref.ref(frames)
    cycle: list = [frames]
    cycle.append(cycle)
    return ref


async def eventually(predicate: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    """Whether `predicate()` holds within `timeout_s`, the event loop running meanwhile."""
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return predicate()


async def freed(ref: weakref.ref, timeout_s: float = 2.0) -> bool:
    """Whether the object behind `ref` is gone within `timeout_s`, the event loop running meanwhile."""
    return await eventually(lambda: ref() is None, timeout_s)


@contextmanager
def collector_off() -> Iterator[None]:
    """Python's own collections off: only an explicit gc.collect() (the reclaimer's) frees cycles."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
