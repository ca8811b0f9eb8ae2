"""The real server in this process: the app, uvicorn with its guards and drain, on 127.0.0.1 in a
thread, usually on the fake engine. For benchmarks and tests of the server's own machinery, where a
child process (reward_tools.launch.ServerProcess) would hide what the server does from the caller."""

from __future__ import annotations

import threading
import time

import httpx

from reward_server.bootstrap import build_service
from reward_server.http.app import build_app
from reward_server.http.connections import DrainingServer, server_config
from reward_server.settings import ServerSettings
from reward_tools.launch import free_port


class InProcessServer:
    """The real app and HTTP server (uvicorn, guards, drain) on 127.0.0.1 in a thread."""

    def __init__(self, **settings):
        settings.setdefault("engine", "fake")
        settings.setdefault("decode_workers", 1)
        self.settings = ServerSettings(port=free_port(), **settings)
        self.service = build_service(self.settings)
        self.app = build_app(self.service)
        self.server = DrainingServer(
            server_config(self.app, self.settings), self.service, self.settings.shutdown_timeout_s, hard_exit=False
        )
        self.thread = threading.Thread(target=self.server.run, name="in-process-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    @property
    def engine(self):
        return self.service.engine

    def stats(self) -> dict:
        """The server's engine counters, as a client reads them (`GET /stats`)."""
        return httpx.get(f"{self.url}/stats", timeout=60).json()

    def start(self, timeout: float = 60.0) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.started and self.service.status != "loading":
                return self
            if not self.thread.is_alive():
                raise RuntimeError("in-process server stopped while starting")
            time.sleep(0.02)
        raise TimeoutError("in-process server did not start")

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.should_exit = True
            self.thread.join(30)

    def __enter__(self) -> InProcessServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
