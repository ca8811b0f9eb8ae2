"""Running the repository's scripts/ as a user does: a child process with the repository on its
path (scripts import the packages from the checkout, not an installed copy)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def repo_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run_script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python scripts/NAME ARGS...`, its output captured as text."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=repo_env(),
    )
