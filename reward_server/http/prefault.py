"""A large body's pages faulted in by a helper thread, just ahead of the bytes that arrive.

A body's buffer is an anonymous mapping whose pages exist only once written (body.py). Writing the
first byte of each 4 KiB page makes the kernel find and zero a page: for the hook's 192 MiB raw
batch that was ~110 ms of the event loop's time per batch on a 2-core CPU here (the same bytes
written into pages that exist: 6 ms), time in which no other chunk is read and no episode handed
on. Here one helper thread asks the kernel for those pages first (`madvise(MADV_POPULATE_WRITE)`,
Linux 5.14 and later, which fills page tables without writing anything, so it can never race the
bytes the event loop writes), outside the interpreter lock, and the event loop's copy lands in
pages that are already there (measured here: the writer's time 131 -> 21 ms for 192 MiB).

Memory still follows arrival: the pages faulted ahead of the bytes received are never more than the
bytes received so far, and at most `AHEAD_BYTES` (a client that sent one byte holds a page or two,
one that sent 1 MiB at most 2 MiB). Where the call is missing or refused, nothing is faulted ahead
and the event loop takes the faults itself, as before.

The same thread unmaps a body once its request is answered (`unmap_soon`), so the unmapping of a
192 MiB batch body is not the event loop's: where the cycle collector used to free it, the collection
held the event loop 26 ms a run on an H200 host, 3.7 ms once bodies were unmapped here
(docs/bench/h200_2026-12-02_versions). Queued behind the faults asked for that buffer, the
unmapping never pulls pages from under a running `madvise`.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+); Python's mmap module does not name it before 3.13
AHEAD_BYTES = 8 * 1024 * 1024  # the most faulted in beyond what arrived
STEP_BYTES = 2 * 1024 * 1024  # one helper call faults in at least this much (fewer, larger calls)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_madvise = None
_works = sys.platform == "linux"


def _thread() -> ThreadPoolExecutor:
    """The one helper thread, made on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="body-prefault")
        return _pool


def _helper() -> ThreadPoolExecutor | None:
    """The helper thread and libc's madvise for it; None where faulting ahead does not work."""
    global _madvise, _works
    with _lock:
        if not _works:
            return None
        if _madvise is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                madvise = libc.madvise
            except (OSError, AttributeError):
                _works = False
                return None
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            madvise.restype = ctypes.c_int
            _madvise = madvise
    return _thread()


def _unmap(buffer: mmap.mmap) -> None:
    try:
        buffer.close()  # CPython unmaps without the interpreter lock
    except BufferError:
        pass  # still viewed (an episode cancelled mid-way holds its frames): freed with its last view


def unmap_soon(buffer: mmap.mmap) -> None:
    """Unmap a body's buffer in the helper thread, after the faults already asked for it. A buffer
    something still views stays mapped until its last view goes (reference counting frees it)."""
    _thread().submit(_unmap, buffer)


def _populate(buffer: mmap.mmap, address: int, start: int, end: int) -> None:
    """Runs in the helper thread. `buffer` is held by the task, so the mapping stays while the
    kernel fills it; ctypes drops the interpreter lock for the call."""
    global _works
    first = (address + start) & ~(mmap.PAGESIZE - 1)  # madvise takes page-aligned starts
    if _madvise(first, address + end - first, MADV_POPULATE_WRITE) != 0:  # type: ignore[misc]
        errno = ctypes.get_errno()
        if _works:
            logger.info("body pages are not faulted in ahead (madvise: errno %d); the event loop faults them", errno)
        _works = False


class Prefault:
    """Faults in the pages of one mapped body buffer ahead of the bytes received (see the module)."""

    def __init__(self, buffer: mmap.mmap, address: int):
        self.buffer = buffer
        self.address = address  # where the buffer starts
        self.length = len(buffer)
        self.done_to = 0  # pages up to here are asked for

    def arrived(self, received: int) -> None:
        """Called by the body reader after each chunk: ask for the pages just ahead of it."""
        want = min(self.length, received + min(received, AHEAD_BYTES))
        if want - self.done_to < min(STEP_BYTES, self.length - self.done_to) or not _works:
            return
        pool = _helper()
        if pool is None:
            return
        start = max(self.done_to, received)  # what arrived is already there
        self.done_to = want
        if want > start:
            pool.submit(_populate, self.buffer, self.address, start, want)
