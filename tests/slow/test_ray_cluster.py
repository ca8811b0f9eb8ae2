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
import sys
import time

import httpx

from reward_tools.launch import free_port
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.ray_nodes import RAY, RayProcesses, healthy, listening, wait_for


def test_two_ray_nodes_serve_one_clients_requests_with_one_replica_each(tmp_path):
    gcs, port = free_port(), free_port()
    logs = [tmp_path / name for name in ("head.log", "worker.log", "serve.log")]
    ray = RayProcesses()
    try:
        resources = json.dumps({"node_a": 1, "reward_slot": 1})
        head = [RAY, "start", "--head", "--port", str(gcs), "--include-dashboard", "false", "--resources", resources]
        ray.start([*head, *ray.node_flags()], logs[0])
        wait_for(lambda: listening(gcs), 60, "the head node", logs)
        resources = json.dumps({"node_b": 1, "reward_slot": 1})
        worker = [RAY, "start", "--address", f"127.0.0.1:{gcs}", "--resources", resources]
        ray.start([*worker, *ray.node_flags()], logs[1])
        serve = [sys.executable, "-m", "reward_server", "serve-ray", "--address", f"127.0.0.1:{gcs}"]
        serve += ["--num-replicas", "2", "--gpus-per-replica", "0", "--cpus-per-replica", "0.5"]
        serve += ["--resources-per-replica", '{"reward_slot": 1}', "--proxy-location", "HeadOnly"]
        serve += ["--max-ongoing-requests", "2", "--engine", "fake", "--engine-option", "delay_ms=300"]
        serve += ["--decode-workers", "1", "--port", str(port)]
        ray.start(serve, logs[2])
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
        ray.stop()  # the deployment first, then the worker node, then the head; then any straggler
