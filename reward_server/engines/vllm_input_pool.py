"""The vLLM engine's input pool: the threads that process requests' inputs (the chat template,
the HF processor through vLLM's renderer), taking the most urgent job first.

A progress curve's points are not equally urgent. Each chain's longest point (vllm_curves) must be
processed first: its clips become processor-cache hits for the others, and its prompt fills the
prefix cache they read. Of the others, a point whose items are all hits is cheap to process (no HF
processor call), while a point with a tail of its own (`--progress-partial-groups tail`, the
default: every other point of a 16-point curve) runs the HF processor once more. Taken first come,
first served, a batch of 64 curves reached vLLM as it came out of the pool, tails and hits mixed,
and the engine cut it into 26-81 steps (issue 40's eleventh round); its K = 16 repeats spread up to
11.7%. Ranked, the hits of every curve go in right behind the leaders, and the tails' processing
overlaps with the engine's work on them.

Ranks (lower first; first come, first served within a rank):

- LEAD: a single episode, a chain's longest point, a request processed again for a retry;
- HITS: a curve's point whose every item another point of the curve processes (no processor call
  of its own);
- OWN: a curve's point with an item of its own (a tail).

`--engine-option input_order=fifo` takes every job first come, first served, as the former
`ThreadPoolExecutor` did (kept for measuring). The pool is a `concurrent.futures.Executor`, so
`loop.run_in_executor(pool, ...)` submits at rank LEAD.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, Literal

OPTION = "input_order"
InputOrder = Literal["ranked", "fifo"]
ORDERS: tuple[str, ...] = ("ranked", "fifo")
LEAD, HITS, OWN = 0, 1, 2
_STOP = -1  # a stop marker's rank ahead of every job: the threads leave before taking another


def input_order(options: dict[str, Any]) -> InputOrder:
    """The order `--engine-option input_order` asks for (ranked by default). ValueError for
    another value."""
    order = str(options.get(OPTION, "ranked")).strip().lower()
    if order not in ORDERS:
        raise ValueError(f"--engine-option {OPTION}={options.get(OPTION)!r}: allowed {' or '.join(ORDERS)}")
    return order  # type: ignore[return-value]


class InputPool(Executor):
    """`threads` worker threads taking jobs by rank, then by arrival (see the module's notes)."""

    def __init__(self, threads: int, order: InputOrder = "ranked", name: str = "vllm-inputs"):
        if threads < 1:
            raise ValueError(f"an input pool needs at least one thread, not {threads}")
        self.order = order
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._arrival = itertools.count()
        self._closed = False
        self._lock = threading.Lock()  # submit against shutdown
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """fn(*args, **kwargs) at rank LEAD (what `run_in_executor` calls)."""
        return self.submit_ranked(LEAD, fn, *args, **kwargs)

    def submit_ranked(self, rank: int, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """fn(*args, **kwargs) once no job of a lower rank (or, first come first served, no earlier
        job) waits. Cancelling the future before a thread takes it skips the job."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the input pool is shut down")
            key = rank if self.order == "ranked" else LEAD
            self._jobs.put((key, next(self._arrival), future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            _, _, future, fn, args, kwargs = self._jobs.get()
            if future is None:  # shutdown's marker
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller sees it, as from ThreadPoolExecutor
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking jobs; the threads leave once the jobs before them are done, or at once
        with `cancel_futures` (the waiting jobs' futures cancelled)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        job = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    job[2].cancel()
            # one marker per thread: ahead of every job when they are cancelled (a job submitted
            # meanwhile is refused above), else behind every waiting one, which still runs
            stop = _STOP if cancel_futures else OWN + 1
            for _ in self._threads:
                self._jobs.put((stop, next(self._arrival), None, None, (), {}))
        if wait:
            for thread in self._threads:
                thread.join()
