"""Worker processes for work that hostile input can make hang, crash or eat memory.

Video decoding and JSON body parsing run here, never in the server process. Each task has a
time budget and each worker a memory budget (RLIMIT_AS above its size at start, so a bomb
raises MemoryError inside the worker instead of waking the OOM killer). A worker that runs past
its time budget is killed and replaced; a worker that dies (a crash, a signal) is replaced and
its task is tried once more on a fresh worker, then refused. Each is answered as the error of
what the task was reading (`task`: the JSON body, a video, a chat request's images). Later
requests never see a broken pool.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

from reward_server.media.images import ImageTooLarge
from reward_server.media.video import VideoError, VideoTooLarge
from reward_server.request_errors import BodyTooLarge

logger = logging.getLogger(__name__)


class WorkerDied(RuntimeError):
    """A decode worker died while running a task (it has been replaced)."""


@dataclass(frozen=True)
class PoolBudget:
    timeout_s: float = 60.0  # per task
    memory_mb: int = 4096  # per worker, above its size when it started


def _set_memory_limit(memory_mb: int) -> None:
    import resource

    with open("/proc/self/statm") as fh:
        size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = size + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _worker_main(conn: Connection, memory_mb: int) -> None:
    # A signal to the server's whole process group (scancel, systemd's stop) reaches the workers
    # too: they keep decoding while the server drains, and end when it closes their pipe (EOF) or
    # kills them (the pool only ever stops a worker with SIGKILL).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # what tasks need, imported once before the limit is set (imports map libraries)
    import av  # noqa: F401
    import cv2
    import numpy  # noqa: F401

    cv2.setNumThreads(1)  # the pool is the parallelism
    if memory_mb > 0 and os.path.exists("/proc/self/statm"):
        try:
            _set_memory_limit(memory_mb)
        except (OSError, ValueError):
            pass
    conn.send("ready")  # task budgets start counting after the imports, not before
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        try:
            _send_result(conn, fn(*args))
        except MemoryError:
            conn.send((False, MemoryError(), True))  # the pool names it for what the task read
        except VideoTooLarge as exc:
            # a process that came near its memory limit may keep the memory (fragmentation): recycle it
            conn.send((False, exc, True))
        except Exception as exc:
            try:
                conn.send((False, exc, False))
            except Exception:  # an exception that does not pickle
                conn.send((False, RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"), False))


@dataclass(frozen=True)
class _ArrayFollows:
    """Stands in for a large array result (or a list of arrays: a chat request's images), whose
    bytes follow in chunks the server receives straight into the arrays. A pickled array, or its
    bytes as one message, would be held twice for a moment (multiprocessing receives a whole
    message into a buffer of its own, even in recv_bytes_into): gigabytes for a long 1080p
    episode, beyond what the decoded budget admits."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    many: bool  # a list of arrays, not one array


DIRECT_ARRAY_BYTES = 1 << 20
ARRAY_CHUNK_BYTES = 1 << 20  # the most a result holds twice while it is received


def _direct_arrays(value: Any) -> list | None:
    """The arrays of a result sent as raw bytes: a large array, or a list of arrays this large together."""
    import numpy as np

    arrays = value if isinstance(value, list) else [value]
    if not arrays or not all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays):
        return None
    return arrays if sum(a.nbytes for a in arrays) >= DIRECT_ARRAY_BYTES else None


def _send_result(conn: Connection, value: Any) -> None:
    import numpy as np

    arrays = _direct_arrays(value)
    if arrays is None:
        conn.send((True, value, False))
        return
    arrays = [np.ascontiguousarray(a) for a in arrays]
    marker = _ArrayFollows(tuple(a.shape for a in arrays), tuple(a.dtype.str for a in arrays), isinstance(value, list))
    conn.send((True, marker, False))
    for array in arrays:
        view = memoryview(array).cast("B")
        for start in range(0, len(view), ARRAY_CHUNK_BYTES):
            conn.send_bytes(view[start : start + ARRAY_CHUNK_BYTES])


def _receive_result(conn: Connection) -> tuple[bool, Any, bool]:
    ok, value, recycle = conn.recv()
    if isinstance(value, _ArrayFollows):
        import numpy as np

        arrays = []
        for shape, dtype in zip(value.shapes, value.dtypes, strict=True):
            array = np.empty(shape, dtype=np.dtype(dtype))
            view, received = memoryview(array).cast("B"), 0
            while received < len(view):
                received += conn.recv_bytes_into(view, received)
            arrays.append(array)
        value = arrays if value.many else arrays[0]
    return ok, value, recycle


STARTUP_TIMEOUT_S = 120.0
Task = Literal["body", "video", "image", "media"]
# what a task works on -> how the pool's errors name it
_DOING = {
    "body": "parsing this JSON body",
    "video": "decoding this video",
    "image": "decoding this request's images",
    "media": "decoding this request's images and video",
}


def _over_budget(task: Task, overrun: str) -> Exception:
    """A task past its time or memory budget, as the error of what it was reading (errors.py)."""
    message = f"{_DOING[task]} {overrun}"
    if task == "body":
        return BodyTooLarge(
            f"{message}; send the frames as a raw batch (application/x-reward-batch) or fewer per request"
        )
    if task == "image":
        return ImageTooLarge(message)
    return VideoTooLarge(message)


def _died(task: Task) -> Exception:
    message = f"{_DOING[task]} killed the decode worker twice (out of memory or a crash); refused"
    # JSON parsing has no decoder to crash: a worker that dies parsing ran out of memory
    return BodyTooLarge(message + " (--decode-memory-mb)") if task == "body" else WorkerDied(message)


_SPAWN_LOCK = threading.Lock()


class _Worker:
    """One worker process and the pipe to it; used by one thread at a time."""

    def __init__(self, ctx, memory_mb: int):
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, memory_mb), daemon=True, name="reward-decode")
        with _SPAWN_LOCK:
            # glibc reserves 64 MB of address space per malloc arena (one per thread, lazily):
            # under an address-space limit, two arenas keep the budget for real allocations
            saved = os.environ.get("MALLOC_ARENA_MAX")
            os.environ["MALLOC_ARENA_MAX"] = "2"
            try:
                self.proc.start()
            finally:
                if saved is None:
                    os.environ.pop("MALLOC_ARENA_MAX", None)
                else:
                    os.environ["MALLOC_ARENA_MAX"] = saved
        child.close()
        self.ready = False

    def call(self, fn: Callable, args: tuple, timeout_s: float) -> tuple[bool, Any, bool]:
        if not self.ready:
            if not self.conn.poll(STARTUP_TIMEOUT_S):
                raise EOFError("decode worker did not start")
            self.conn.recv()
            self.ready = True
        self.conn.send((fn, args))
        if not self.conn.poll(timeout_s):
            raise TimeoutError
        return _receive_result(self.conn)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class DecodePool:
    def __init__(self, workers: int, budget: PoolBudget = PoolBudget()):
        self.size = max(1, workers)
        self.budget = budget
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process holding CUDA or vLLM threads
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(self.size, thread_name_prefix="decode-ipc")
        self._slots = asyncio.Semaphore(self.size)
        self.replaced = 0  # workers killed or found dead and replaced (exported as a metric)
        self._closed = False

    def _new(self) -> _Worker:
        worker = _Worker(self._ctx, self.budget.memory_mb)
        with self._lock:
            self._all.add(worker)
        return worker

    def start(self) -> None:
        """Start the workers now (each takes ~1 s to import what it needs)."""
        for _ in range(self.size):
            worker = self._new()
            with self._lock:
                self._idle.append(worker)

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._new()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.kill()
            else:
                self._idle.append(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)
        self.replaced += 1
        if not self._closed:
            self._give_back(self._new())

    def _call(self, fn: Callable, args: tuple, task: Task = "video") -> Any:
        """Run fn(*args) in a worker (this thread waits); retried once if the worker dies."""
        for attempt in (1, 2):
            worker = self._take()
            started = time.monotonic()
            try:
                ok, value, recycle = worker.call(fn, args, self.budget.timeout_s)
            except TimeoutError:
                logger.warning("decode task ran past %.0f s; its worker is replaced", self.budget.timeout_s)
                self._replace(worker)
                raise _over_budget(
                    task, f"took longer than the {self.budget.timeout_s:g} s budget (--decode-timeout-s)"
                ) from None
            except (EOFError, OSError, BrokenPipeError):
                code = worker.proc.exitcode
                logger.warning(
                    "decode worker died (exit code %s) after %.1f s; replaced (attempt %d)",
                    code,
                    time.monotonic() - started,
                    attempt,
                )
                self._replace(worker)
                if attempt == 2:
                    raise _died(task) from None
                continue
            if recycle:
                self._replace(worker)
            else:
                self._give_back(worker)
            if ok:
                return value
            if isinstance(value, MemoryError):
                memory = f"needs more memory than a decode worker has (--decode-memory-mb {self.budget.memory_mb})"
                raise _over_budget(task, memory)
            raise value
        raise AssertionError("unreachable")

    async def run(self, fn: Callable, *args: Any, task: Task = "video") -> Any:
        """fn(*args) in a worker process, within the pool's budget; `task` names what it reads, so
        a budget overrun or a dead worker is reported as that input's error."""
        if self._closed:
            raise RuntimeError("the decode pool is shut down")
        async with self._slots:
            return await asyncio.get_running_loop().run_in_executor(self._threads, self._call, fn, args, task)

    def pids(self) -> list[int]:
        """Process ids of the workers (idle or busy)."""
        with self._lock:
            return [w.proc.pid for w in self._all if w.proc.pid is not None]

    def shutdown(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        for worker in workers:
            worker.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)


__all__ = ["DecodePool", "PoolBudget", "VideoError", "VideoTooLarge", "WorkerDied"]
