"""Ray Serve: two replicas of the tiny checkpoint (vllm engine on CPU) behind one endpoint.

The same app as `python -m reward_server` answers /score and the batch form; when one replica's
process is killed, the service keeps answering and the client's retries land on the other
replica; every episode gets its score.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from reward_client.client import RetryPolicy, RewardClient
from reward_client.protocol import ScoreRequest
from reward_tools.launch import free_port
from tests.conftest import CPU_PRESET, episode_frames, inline

pytestmark = pytest.mark.engine


def replica_pids() -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "ServeReplica:reward_server" in " ".join(p.info["cmdline"] or [])
    ]


def body(i: int) -> dict:
    return {
        "task_text": f"task {i}",
        "frames": inline(episode_frames(8, seed=i)),
        "backend_kwargs": {"score_mode": "logprob"},
    }


@pytest.fixture
def ray_server(tiny_checkpoint, tmp_path):
    port = free_port()
    log = open(tmp_path / "serve-ray.log", "wb")
    cmd = [
        sys.executable,
        "-m",
        "reward_server",
        "serve-ray",
        "--num-replicas",
        "2",
        "--gpus-per-replica",
        "0",
        "--config",
        str(CPU_PRESET),
        "--engine",
        "vllm",
        "--model-path",
        tiny_checkpoint,
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve-ray.log").read_text()[-3000:]
            try:
                if len(replica_pids()) == 2 and all(
                    httpx.get(f"{url}/health", timeout=5).json()["status"] == "ok" for _ in range(6)
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("Ray Serve replicas not ready: " + (tmp_path / "serve-ray.log").read_text()[-3000:])
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["ray", "stop", "--force"], capture_output=True)
        log.close()


def test_two_replicas_serve_and_survive_the_loss_of_one(ray_server):
    single = httpx.post(f"{ray_server}/score", json=body(0), timeout=120)
    assert single.status_code == 200 and single.json()["parse_status"] == "logprob"
    batch = httpx.post(f"{ray_server}/score/batch", json={"requests": [body(i) for i in range(4)]}, timeout=120)
    assert batch.status_code == 200 and all(item["response"] for item in batch.json()["results"])

    victim = replica_pids()[0]
    os.kill(victim, signal.SIGKILL)  # one replica dies
    client = RewardClient(ray_server, RetryPolicy(deadline_s=240, backoff_max_s=2))
    scores = [client.score(ScoreRequest.model_validate(body(10 + i))).score for i in range(8)]
    assert len(scores) == 8 and all(0.0 <= s <= 1.0 for s in scores)  # nothing lost
    assert httpx.get(f"{ray_server}/health", timeout=10).json()["status"] == "ok"
