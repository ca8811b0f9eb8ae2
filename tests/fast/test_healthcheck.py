"""`python -m reward_server.healthcheck` (the container's HEALTHCHECK): the address comes from the
server's own flags, and the exit code says whether /health answers ok. Fast tier: the fake
engine in process, and a /proc laid out by hand."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reward_server.healthcheck import health_url, main, server_processes
from reward_tools.launch import free_port
from tests.helpers.servers import InProcessServer

REPO = Path(__file__).resolve().parents[2]


def test_the_address_comes_from_the_servers_flags(tmp_path):
    assert health_url([], tmp_path) == "http://127.0.0.1:18080/health"
    assert health_url(["--host", "0.0.0.0", "--port", "18188"], tmp_path) == "http://127.0.0.1:18188/health"
    assert health_url(["--host", "::"], tmp_path) == "http://[::1]:18080/health"
    assert health_url(["--host", "10.1.2.3", "--port", "9"], tmp_path) == "http://10.1.2.3:9/health"
    # a preset named relative to the server's working directory, and a later flag winning over it
    (tmp_path / "preset.yaml").write_text("port: 18999\n")
    assert health_url(["--config", "preset.yaml"], tmp_path) == "http://127.0.0.1:18999/health"
    assert health_url(["--config", "preset.yaml", "--port", "1234"], tmp_path).endswith(":1234/health")


def test_finds_reward_server_processes_in_proc(tmp_path):
    def process(pid: int, *argv: str) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        (tmp_path / str(pid) / "cwd").symlink_to(tmp_path)

    process(1, "tini", "--", "python", "-m", "reward_server", "--host", "0.0.0.0")
    process(7, "/opt/venv/bin/python", "-m", "reward_server", "--host", "0.0.0.0", "--port", "18188")
    process(9, "python", "-m", "reward_server", "serve-ray", "--num-replicas", "2")  # serves elsewhere
    process(12, "python", "-c", "from multiprocessing.spawn import spawn_main")
    (tmp_path / "self").mkdir()
    found = server_processes(tmp_path)
    # tini's own command line names the server too; both carry the same flags in a container
    assert [(pid, flags) for pid, flags, _ in found] == [
        (1, ["--host", "0.0.0.0"]),
        (7, ["--host", "0.0.0.0", "--port", "18188"]),
    ]


def test_exit_code_follows_health():
    with InProcessServer() as server:
        assert main(["--url", f"{server.url}/health"]) == 0
    assert main(["--url", f"http://127.0.0.1:{free_port()}/health", "--timeout", "2"]) == 1


def test_runs_as_a_module_and_says_why_it_is_unhealthy():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    url = f"http://127.0.0.1:{free_port()}/health"
    result = subprocess.run(
        [sys.executable, "-m", "reward_server.healthcheck", "--url", url], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1 and result.stdout.startswith(url), result.stdout + result.stderr
