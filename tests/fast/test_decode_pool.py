"""The decode pool's result transfer: a large array (or a chat request's list of images) comes
back from a worker straight into its array, never held twice (once as the message, once as the
array), so the decoded-memory budget is what the server holds. Fast tier."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from reward_protocol.frames import QWEN2_5_VL
from reward_server.media.decode_pool import DecodePool, Task
from reward_server.media.images import MediaRef, decode_chat_media
from reward_server.media.video import DecodeLimits
from reward_tools.bench_chat import frame, jpeg_data_url

MB = 2**20


def run_traced(fn: Callable, *args: Any, task: Task = "video") -> tuple[Any, int]:
    """fn(*args) in a decode worker, and the most memory this process held while receiving it."""
    pool = DecodePool(1)
    pool.start()
    try:
        asyncio.run(pool.run(np.zeros, 8))  # the worker has started and answered once
        tracemalloc.start()
        try:
            value = asyncio.run(pool.run(fn, *args, task=task))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        pool.shutdown()
    return value, peak


def test_a_large_array_result_is_received_into_its_array_without_a_second_copy():
    array, peak = run_traced(np.full, (64, MB), 7, np.uint8)
    assert array.shape == (64, MB) and array.dtype == np.uint8
    assert (array[:, ::4096] == 7).all() and array[-1, -1] == 7
    assert peak < 64 * MB + 8 * MB, f"{peak / MB:.0f} MB held to receive a 64 MB array"


def test_a_chat_requests_decoded_images_are_received_without_a_second_copy():
    """A list of arrays (a chat request's 16 images, 49 MiB model-ready) comes back the same way."""
    refs = [MediaRef("image", jpeg_data_url(frame(i, 0, size=1024), 90), f"m[{i}]") for i in range(16)]
    images, peak = run_traced(decode_chat_media, refs, [], DecodeLimits(), QWEN2_5_VL, 16, 200704, task="image")
    assert isinstance(images, list) and len(images) == 16
    assert all(img.shape == (1036, 1036, 3) and img.dtype == np.uint8 for img in images)
    assert images[0].std() > 0 and not np.array_equal(images[0], images[1])
    total = sum(img.nbytes for img in images)
    assert peak < total + 8 * MB, f"{peak / MB:.0f} MB held to receive {total / MB:.0f} MB of images"
