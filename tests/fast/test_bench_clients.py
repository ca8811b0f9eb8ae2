"""reward_tools.bench_clients: several client processes, each sending its own batch, against the
fake engine (fast tier): one server, and a replica list that both replicas serve."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.servers import InProcessServer


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reward_tools.bench_clients", *args], capture_output=True, text=True, timeout=240
    )


def test_clients_each_send_their_own_batch_and_the_wall_covers_them_all(tmp_path):
    with InProcessServer(engine_option=["delay_ms=200"]) as server:
        proc = run(
            "--url", server.url, "--clients", "1", "3", "--n", "4", "--size", "64", "--frames", "4",
            "--rounds", "1", "--warmup-rounds", "1", "--out", str(tmp_path / "c.json"),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen = server.engine.seen
    report = json.loads(proc.stdout)
    assert report == json.loads((tmp_path / "c.json").read_text())
    one, three = report["results"]
    assert (one["clients"], three["clients"]) == (1, 3) and three["episodes"] == 12 and three["errors"] == 0
    assert len(seen) == (1 + 3) * 4 * 2  # every client's batch, the warm-up round included
    assert len({float(r.video[-1].mean()) for r in seen}) == len(seen)  # never the same episode twice
    for row in (one, three):
        (counted,) = row["rounds"]
        assert len(counted["client_s"]) == row["clients"]
        assert row["wall_s"] >= max(counted["client_s"]) >= 0.2  # the fake engine's 200 ms per episode
        assert row["episodes_per_s"] == row["episodes"] / row["wall_s"]


def test_a_replica_list_is_served_by_every_replica():
    with InProcessServer() as a, InProcessServer() as b:
        url = f"{a.url},{b.url}"
        proc = run("--url", url, "--clients", "2", "--n", "4", "--size", "64", "--rounds", "1", "--warmup-rounds", "0")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(a.engine.seen) == len(b.engine.seen) == 4  # each client's batch split across both
    (row,) = json.loads(proc.stdout)["results"]
    assert row["replicas"] == 2 and row["episodes"] == 8


def test_bench_report_tables_client_files_against_the_first(tmp_path):
    def row(replicas: int, clients: int, eps: float) -> dict:
        return {"replicas": replicas, "clients": clients, "style": "logprob", "n_per_client": 64,
                "episodes": clients * 64, "wall_s": clients * 64 / eps, "episodes_per_s": eps}  # fmt: skip

    (tmp_path / "ray_1.json").write_text(json.dumps({"results": [row(1, 2, 20.0), row(1, 4, 25.0)]}))
    (tmp_path / "ray_2.json").write_text(json.dumps({"results": [row(2, 2, 36.0), row(2, 4, 47.5)]}))
    out = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench_report", str(tmp_path / "ray_1.json"), str(tmp_path / "ray_2.json")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "| ray_2 | 2 | logprob | 2 | 128 | 3.56 | 36.00 | 1.80 |" in out
    assert "| ray_2 | 2 | logprob | 4 | 256 | 5.39 | 47.50 | 1.90 |" in out
