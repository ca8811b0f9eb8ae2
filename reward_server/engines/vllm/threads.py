"""How many threads torch's CPU operations use beside a vLLM engine on a GPU: one per process by
default, `--engine-option torch_threads=N` to choose. And how many threads process the engine's
inputs in the server (`input_threads`, `--engine-option preprocess_threads=N`): two by default.

Torch sizes its CPU thread pool to the machine's cores in every process. Beside a GPU engine two
processes use it: the server's, whose input threads run the HF processor (parallel already: one
episode per thread), and vLLM's engine core, which gathers each step's pixels with one large
`torch.cat` on the CPU before the vision encoder runs, while the GPU waits. With a pool of 16
threads in each of them and every core busy, that copy waits for descheduled pool threads. On an
H200 machine of 16 cores, 64 episodes on the hook path took 1.65 s with one thread against 1.68 s
with 16 (medians of 15, three pairs), the encoder's calls a median 34 ms against 49 ms
(docs/bench/h200_2026-11-29_issue40_round6/; `reward_tools/benchmarks/torch_threads.py` shows the copy on
a CPU). vLLM 0.24 sets one thread only for the worker processes it starts when it runs several
(`OMP_NUM_THREADS=1` unless set); a single-GPU engine runs its worker inside the engine core,
where it does not. vLLM 0.32 sets one thread in the engine core for serving itself (an
`OMP_NUM_THREADS` that is set wins), so there this module adds the server's side only.

The count reaches the engine core through `OMP_NUM_THREADS`, which the engine core's process
reads when torch starts (it inherits the server's environment), as do the server's video decode
workers started after it (a replaced one; the first ones start before the engine, with torch's
count). An `OMP_NUM_THREADS` the user set is kept. On CPUs nothing changes unless asked: there
vLLM's model runs on these threads (in vLLM's worker process; with the worker inside the engine
core, the CPU default, on vLLM's serving count: engines/vllm/worker_in_core.py).
"""

from __future__ import annotations

import logging
import os

from reward_server.engines.vllm.patches import parse_options

logger = logging.getLogger(__name__)

OPTION = "torch_threads"
ENV = "OMP_NUM_THREADS"
GPU_DEFAULT = 1
INPUT_OPTION = "preprocess_threads"
# The input pool's threads (VllmEngine._input) hold the interpreter lock for most of their work
# (the HF processor, vLLM's field layout), so more of them mostly wait for it, and the same inputs
# cost more CPU: on an H200 host of 16 cores, the 1024 prompts of 64 16-point curves took 3.7-3.8 s
# to process with one or two threads, 4.4 s with four and 4.9-5.4 s with eight
# (reward_tools/benchmarks/curve_feed.py, issue 40's tenth round). Two keep one slow request from holding up
# the others.
INPUT_DEFAULT = 2


def wanted_threads(options: dict[str, str], on_gpu: bool, environ: dict[str, str] | None = None) -> int | None:
    """The thread count to set, or None to leave torch's as it is. ValueError for a count that is
    not a whole number of at least 1."""
    environ = os.environ if environ is None else environ
    count = parse_options(options).torch_threads  # ValueError saying what is allowed
    if count is not None:
        return count
    if ENV in environ or not on_gpu:
        return None
    return GPU_DEFAULT


def use_threads(count: int) -> None:
    """This process's torch and the engine core it starts next use `count` threads."""
    import torch

    previous = torch.get_num_threads()
    os.environ[ENV] = str(count)
    torch.set_num_threads(count)
    logger.info("torch threads %d -> %d here and in the engine core (--engine-option %s)", previous, count, OPTION)


def input_threads(options: dict[str, str], cores: int | None = None) -> int:
    """The engine's input threads: `preprocess_threads` if given (0: processed inline, on the event
    loop), else INPUT_DEFAULT, or one on a machine of fewer than four cores. ValueError for a count
    that is not a whole number of at least 0."""
    count = parse_options(options).input_threads  # ValueError saying what is allowed
    if count is not None:
        return count
    cores = cores if cores is not None else (os.cpu_count() or 2)
    return max(1, min(INPUT_DEFAULT, cores // 2))
