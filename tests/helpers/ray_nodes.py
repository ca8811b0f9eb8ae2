"""Ray nodes a test starts, and stops again: its own, never anyone else's.

Every process of one test's Ray cluster (`ray start` nodes, the `serve-ray` driver and whatever
Ray spawns from them: GCS, raylets, workers, replicas) carries a mark of that test in its
environment, which Ray hands on to the processes it starts. Teardown stops the processes the
test started by process group, then kills whatever still carries the mark (a worker that
outlived its raylet). It never runs `ray stop`, which stops every Ray process on the machine:
another test's, another user's, RLinf's.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

RAY = str(Path(sys.executable).with_name("ray"))
RAY_MARK = "REWARD_SERVER_TEST_RAY"


def token_env() -> dict[str, str]:
    """Every process of the cluster gets the same token in the environment, as the docs say.

    Ray 2.60's head turns token auth on by itself when ~/.ray/auth_token exists (any earlier local
    `ray.init()` writes one), but a joining `ray start` does not: without this the worker node and
    the deployment were refused with InvalidAuthToken on a machine that had such a file.
    """
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def wait_for(predicate, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:] for p in logs if p.exists())
    pytest.fail(f"{what} not within {timeout:.0f} s\n{tails}")


class RayProcesses:
    """One test's Ray processes: started with its mark, stopped by it, and only those."""

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.env = {**token_env(), RAY_MARK: self.mark}
        self.temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
        self.started: list[subprocess.Popen] = []

    def start(self, cmd: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        self.started.append(proc)
        return proc

    def node_flags(self) -> list[str]:
        """Flags of a small `ray start` node kept in this test's temp dir, in the foreground."""
        return [
            "--num-cpus",
            "2",
            "--object-store-memory",
            str(100 * 2**20),
            "--disable-usage-stats",
            "--temp-dir",
            self.temp,
            "--block",
        ]

    def marked(self) -> list[psutil.Process]:
        """The live processes that carry this test's mark (Ray's workers and replicas included)."""
        mark = f"{RAY_MARK}={self.mark}"
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and mark in (f"{k}={v}" for k, v in proc.environ().items()):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def stop(self) -> None:
        """The last started first (a deployment before the nodes it runs on): SIGTERM to its
        process group (`ray start --block` then stops its node), SIGKILL if it hangs; then any
        marked process that is still alive."""
        for proc in reversed(self.started):
            _stop_group(proc)
        left = self.marked()
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        shutil.rmtree(self.temp, ignore_errors=True)


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        proc.wait()
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
