"""The decode pool's result transfer: a large array comes back from a worker straight into its
array, never held twice (once as the message, once as the array), so the decoded-memory budget
is what the server holds. Fast tier."""

from __future__ import annotations

import asyncio
import tracemalloc

import numpy as np

from reward_server.decode_pool import DecodePool

MB = 2**20


def test_a_large_array_result_is_received_into_its_array_without_a_second_copy():
    pool = DecodePool(1)
    pool.start()
    try:
        asyncio.run(pool.run(np.zeros, 8))  # the worker has started and answered once
        tracemalloc.start()
        try:
            array = asyncio.run(pool.run(np.full, (64, MB), 7, np.uint8))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        pool.shutdown()
    assert array.shape == (64, MB) and array.dtype == np.uint8
    assert (array[:, ::4096] == 7).all() and array[-1, -1] == 7
    assert peak < 64 * MB + 8 * MB, f"{peak / MB:.0f} MB held to receive a 64 MB array"
