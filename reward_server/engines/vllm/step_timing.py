"""Each engine step as vLLM's worker spent it, for profiles: `--engine-option step_timing=PATH`.

The step log (`step_log`) sees a step when its outputs reach the server's process, so it cannot
tell a step that waited for the GPU from one that waited for the CPU that launches its kernels.
This one times the worker's own calls and appends one JSON line per call to PATH:

- `what`: `execute` (vLLM's `execute_model`: inputs gathered, the vision encoder and the model's
  kernels launched; with vLLM's asynchronous scheduling it returns before the GPU is done) or
  `sample` (`sample_tokens`, where the step's output is taken);
- `t0`, `t1`: its start and end on time.monotonic (the clock of the step log and of
  reward_tools.bench's batch windows, across processes of one machine);
- `cpu_ms`: the CPU time of the calling thread in it. Wall minus this is time the thread slept (a
  lock, the interpreter); waits on the GPU spin and count as CPU, so this alone does not separate
  launching kernels from waiting for them;
- `encoder_ms`, `encoder_calls`: the vision encoder's share (vLLM's `_execute_mm_encoder`); null
  where the model runner has no such method (vLLM's Model Runner V2): never a zero it did not measure;
- `tokens`, `requests`, `new_requests`: what the step scheduled;
- `gc_ms`, `gc_full`: the cycle collector's pauses inside the call (all of them, ms) and how many
  of them were full collections (generation 2).

Every full collection, inside a call or between calls, also gets a line of its own: `what: "gc"`,
its `t0`/`t1` and how many objects it freed. A full collection scans every object the process has
not frozen and holds the interpreter that launches the kernels (engines/vllm/heap.py).

Why (issue 40, fifth round): the step log put the first step of each 64-episode batch 0.22-0.28 s
after the batch began. Timed here, the worker started it at 71 ms: with vLLM's asynchronous
scheduling a step's output is handed over only after the next step has been launched.

Like the other worker features it is a mixin of the engine's worker extension
(engines/vllm/worker.py), called once after start through `collective_rpc`; off unless asked for.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

OPTION = "step_timing"
METHOD = "reward_step_timing"
_MARK = "_reward_timed"


def _scheduled(scheduler_output: Any) -> dict[str, int]:
    counts = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    return {
        "tokens": int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0),
        "requests": len(counts),
        "new_requests": len(getattr(scheduler_output, "scheduled_new_reqs", None) or ()),
    }


class GcPauses:
    """The cycle collector's pauses in this process, from `gc.callbacks`: their running total, and
    the full collections as rows (drained by the step that follows them)."""

    def __init__(self) -> None:
        self.total_ms = 0.0
        self.full = 0
        self.rows: list[dict[str, Any]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.monotonic()
            return
        ended = time.monotonic()
        self.total_ms += (ended - self._started) * 1000
        if info.get("generation") == 2:
            self.full += 1
            freed = info.get("collected")
            self.rows.append({"what": "gc", "t0": round(self._started, 6), "t1": round(ended, 6), "collected": freed})

    def drain(self) -> list[dict[str, Any]]:
        rows, self.rows = self.rows, []
        return rows


def time_runner(runner: Any, path: str) -> dict[str, bool]:
    """Time this vLLM model runner's steps into `path` (see the module): whether its steps are timed
    (`timed`: False where the runner has no `execute_model`, it then runs as it is) and whether the
    vision encoder's share is (`encoder`: False on a runner without `_execute_mm_encoder`, V2's)."""
    execute = getattr(runner, "execute_model", None)
    encode = getattr(runner, "_execute_mm_encoder", None)
    if execute is None:
        return {"timed": False, "encoder": False}
    if getattr(execute, _MARK, False):
        return {"timed": True, "encoder": encode is not None}
    log = open(path, "a", buffering=1)  # open while the worker lives
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    encoder = {"s": 0.0, "calls": 0}
    if encode is not None:

        def timed_encode(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return encode(*args, **kwargs)
            finally:
                encoder["s"] += time.perf_counter() - start
                encoder["calls"] += 1

        runner._execute_mm_encoder = timed_encode

    def timed(what: str, call: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            encoder["s"], encoder["calls"] = 0.0, 0
            gc_ms, gc_full = pauses.total_ms, pauses.full
            start, cpu = time.monotonic(), time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                row: dict[str, Any] = {
                    "what": what,
                    "t0": round(start, 6),
                    "t1": round(time.monotonic(), 6),
                    "cpu_ms": round((time.thread_time() - cpu) * 1000, 3),
                    "gc_ms": round(pauses.total_ms - gc_ms, 3),
                    "gc_full": pauses.full - gc_full,
                }
                if what == "execute":
                    timed_encoder = encode is not None  # else unmeasured: null, not zero
                    row["encoder_ms"] = round(encoder["s"] * 1000, 3) if timed_encoder else None
                    row["encoder_calls"] = encoder["calls"] if timed_encoder else None
                    row.update(_scheduled(args[0] if args else kwargs.get("scheduler_output")))
                for line in [*pauses.drain(), row]:
                    log.write(json.dumps(line) + "\n")

        setattr(run, _MARK, True)
        return run

    runner.execute_model = timed("execute", execute)
    sample = getattr(runner, "sample_tokens", None)
    if sample is not None:
        runner.sample_tokens = timed("sample", sample)
    return {"timed": True, "encoder": encode is not None}


class StepTiming:
    """vLLM's worker extension: the method the engine calls once after start, with the file."""

    def reward_step_timing(self, path: str) -> dict[str, bool]:
        done = time_runner(getattr(self, "model_runner", None), path)
        if not done["timed"]:
            logger.warning("this vLLM's model runner has no execute_model to time; steps are not timed")
        elif not done["encoder"]:
            logger.warning("this vLLM's model runner has no _execute_mm_encoder (V1's): encoder_ms is null")
        return done
