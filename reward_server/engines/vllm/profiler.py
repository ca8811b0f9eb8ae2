"""vLLM's torch profiler on the server's path: `--engine-option profile_dir=DIR`.

`reward_tools.bench_raw --profile-dir` traces the bare engine, whose requests all arrive at once
from inputs in memory; the server's steps start as episodes stream in and are prepared by its
input threads, so where its GPU waits can differ (issue 40). With this option the engine runs with
vLLM's profiler configured and the server answers `POST /start_profile` and `POST /stop_profile`
(vLLM serve's names); the worker writes a Chrome trace under DIR when stopped, which
`python -m reward_tools.gpu_trace DIR` reads. Only the engine core is traced (vLLM's
`ignore_frontend`): tracing the server's own process would slow the path being measured.
"""

from __future__ import annotations

import os
from typing import Any

OPTION = "profile_dir"


def profiler_config(options: dict[str, Any]) -> dict[str, Any] | None:
    """vLLM's `profiler_config` engine argument for these engine options, or None without one;
    ValueError when `profiler_config` is given too (two answers to one question)."""
    directory = options.get(OPTION)
    if not directory:
        return None
    if "profiler_config" in options:
        raise ValueError(
            f"--engine-option {OPTION} and --engine-option profiler_config both configure vLLM's profiler: give one"
        )
    return {"profiler": "torch", "torch_profiler_dir": os.path.abspath(str(directory)), "ignore_frontend": True}


def configured(kwargs: dict[str, Any]) -> bool:
    """Whether these engine arguments give vLLM a profiler (ours, or `profiler_config` set by hand)."""
    config = kwargs.get("profiler_config")
    return isinstance(config, dict) and bool(config.get("profiler"))
