"""Start a reward server as a child process and wait for it: used by the demo, tests and benchmarks.

The child gets its own process group, so stopping it also stops vLLM's engine processes.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)


class ServerFailed(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        flags: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_path: str | os.PathLike | None = None,
        env: dict[str, str] | None = None,
    ):
        self.flags = list(flags)
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/reward-server-{self.port}.log")
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.health_seen: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerProcess:
        if self.proc is not None:  # already started (`with server:` after start() must not start a second)
            return self
        cmd = [sys.executable, "-m", "reward_server", *self.flags, "--host", self.host, "--port", str(self.port)]
        logger.info("starting: %s", " ".join(cmd))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        return self

    def wait_ready(self, timeout: float = 600.0) -> list[str]:
        """Poll /health until `ok`; returns the statuses seen on the way. Raises if the server
        exits, reports `failed`, or is not ready in time."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise ServerFailed(f"server exited with code {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    status = client.get(f"{self.url}/health").json().get("status", "?")
                except (httpx.HTTPError, ValueError):
                    status = None
                if status is not None and (not self.health_seen or self.health_seen[-1] != status):
                    self.health_seen.append(status)
                if status == "ok":
                    return self.health_seen
                if status == "failed":
                    raise ServerFailed(f"server reports failed:\n{self.log_tail()}")
                time.sleep(0.25)
        raise ServerFailed(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("server did not stop in %.0f s; killing it", timeout)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftovers of the group (engine processes)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
