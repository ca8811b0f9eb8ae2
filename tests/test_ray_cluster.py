"""More than one machine, on one machine: a Ray cluster of two nodes (two `ray start` processes,
each advertising its own custom resource and one `reward_slot`), the server deployed with one
replica per node (fake engine), and one client's requests answered by both replicas.

The proxy runs on the head node only (`--proxy-location HeadOnly`: two proxies on one host would
share the port). It prefers the replica on its own node, as every node's proxy does in a real
cluster, and sends a request elsewhere once that replica holds `--max-ongoing-requests` (2 here).
Every answer names its replica in `x-reward-replica` (`<replica id>@<node id>`).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from reward_tools.launch import free_port
from tests.conftest import episode_frames, inline

pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))


def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def token_env() -> dict[str, str]:
    """Every process of the cluster gets the same token in the environment, as the README says.

    Ray 2.60's head turns token auth on by itself when ~/.ray/auth_token exists (any earlier local
    `ray.init()` writes one), but a joining `ray start` does not: without this the worker node and
    the deployment were refused with InvalidAuthToken on a machine that had such a file.
    """
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (`ray start --block` stops the node's processes), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(predicate, timeout: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:] for p in logs if p.exists())
    pytest.fail(f"{what} not within {timeout:.0f} s\n{tails}")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def test_two_ray_nodes_serve_one_clients_requests_with_one_replica_each(tmp_path):
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # Ray's socket paths must stay short
    gcs, port = free_port(), free_port()
    node = ["--num-cpus", "2", "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]
    node += ["--temp-dir", temp, "--block"]
    logs = [tmp_path / name for name in ("head.log", "worker.log", "serve.log")]
    procs: list[subprocess.Popen] = []
    env = token_env()
    try:
        resources = json.dumps({"node_a": 1, "reward_slot": 1})
        head = [RAY, "start", "--head", "--port", str(gcs), "--include-dashboard", "false", "--resources", resources]
        procs.append(start([*head, *node], logs[0], env))
        wait_for(lambda: listening(gcs), 60, "the head node", logs)
        resources = json.dumps({"node_b": 1, "reward_slot": 1})
        worker = [RAY, "start", "--address", f"127.0.0.1:{gcs}", "--resources", resources]
        procs.append(start([*worker, *node], logs[1], env))
        serve = [sys.executable, "-m", "reward_server", "serve-ray", "--address", f"127.0.0.1:{gcs}"]
        serve += ["--num-replicas", "2", "--gpus-per-replica", "0", "--cpus-per-replica", "0.5"]
        serve += ["--resources-per-replica", '{"reward_slot": 1}', "--proxy-location", "HeadOnly"]
        serve += ["--max-ongoing-requests", "2", "--engine", "fake", "--engine-option", "delay_ms=300"]
        serve += ["--decode-workers", "1", "--port", str(port)]
        procs.append(start(serve, logs[2], env))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: healthy(url), 90, "the Serve deployment", logs)

        body = {"task_text": "put the bowl on the plate", "frames": inline(episode_frames(8))}
        replicas: dict[str, int] = {}
        with httpx.Client(timeout=60) as client, cf.ThreadPoolExecutor(8) as pool:
            deadline = time.monotonic() + 60  # the second replica may still be starting
            while len(replicas) < 2 and time.monotonic() < deadline:
                answers = list(pool.map(lambda _: client.post(f"{url}/score", json=body), range(8)))
                assert all(a.status_code == 200 and a.json()["score"] is not None for a in answers), answers[0].text
                for a in answers:
                    replicas[a.headers["x-reward-replica"]] = replicas.get(a.headers["x-reward-replica"], 0) + 1
        assert len(replicas) == 2, (replicas, logs[2].read_text(errors="replace")[-3000:])
        nodes = {name.split("@")[1] for name in replicas}
        assert len(nodes) == 2  # one replica on each node
    finally:
        for proc in reversed(procs):  # the deployment first, then the worker node, then the head
            stop(proc)
        shutil.rmtree(temp, ignore_errors=True)
