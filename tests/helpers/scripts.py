"""Running the repository's tools as a user does: a child process with the repository on its path
(the tools import the packages from the checkout, not an installed copy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def repo_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run_tool(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS...` (a module of reward_tools), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=repo_env(),
    )


def failure_text(stderr: str, tail: int = 3000, context: int = 30) -> str:
    """What a failed child printed, for an assertion message: the first error it logged, then the
    end of its stderr. vLLM's frontend ends on "Engine core initialization failed. See root cause
    above": the cause is the engine core's traceback, printed well before that end, which a tail
    alone cuts off. No error logged before the tail (a child killed by a signal logs none): the tail."""
    end = stderr[-tail:]
    first = _FIRST_ERROR.search(stderr)
    if first is None or first.start() >= len(stderr) - tail:
        return end
    line_start = stderr.rfind("\n", 0, first.start()) + 1
    lines = stderr[line_start:].splitlines()[:context]
    return "\n".join(["first error:", *lines, "...", "end:", end])


_FIRST_ERROR = re.compile(r"Traceback \(most recent call last\)| ERROR ")
