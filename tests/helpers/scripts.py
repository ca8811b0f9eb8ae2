"""Running the repository's tools as a user does: a child process with the repository on its path
(the tools import the packages from the checkout, not an installed copy)."""

from __future__ import annotations

import os
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
