"""The benchmark runs in a short mode on CPU and prints / writes what docs/performance.md quotes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import CPU_PRESET


@pytest.mark.engine
def test_bench_short_mode_reports_table_json_and_ratio(tiny_checkpoint, tmp_path):
    out = tmp_path / "bench.json"
    launch = f"--config {CPU_PRESET} --engine hf --model-path {tiny_checkpoint}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reward_server.bench",
            "--launch",
            launch,
            "--n",
            "1",
            "4",
            "--styles",
            "logprob",
            "gen8",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    header, *rows = [line for line in proc.stdout.splitlines() if line.startswith(("style", "logprob", "gen8"))]
    assert header.split()[:4] == ["style", "N", "mode", "eps/s"]
    assert len(rows) == 8  # 2 styles x 2 N x (together, one at a time)
    assert "batched vs one-at-a-time, gen8@4:" in proc.stdout
    report = json.loads(out.read_text())
    assert report["server"]["status"] == "ok" and report["server"]["engine"] == "hf"
    results = report["results"]
    assert {(r["style"], r["n"], r["mode"]) for r in results} == {
        (s, n, m) for s in ("logprob", "gen8") for n in (1, 4) for m in ("together", "one_at_a_time")
    }
    for r in results:
        assert r["errors"] == 0 and r["episodes_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
        assert r["engine_ms"] > 0
    assert set(report["batched_vs_one_at_a_time"]) == {"logprob@1", "logprob@4", "gen8@1", "gen8@4"}
    assert report["engine_stats"]["max_batch_size"] >= 2  # the 4 together were batched


def test_client_bench_reports_bounded_buffers():
    proc = subprocess.run(
        [sys.executable, "scripts/bench_client.py", "--envs", "4", "--steps", "64", "--size", "64"],
        capture_output=True,
        text=True,
        check=True,
    )
    values = dict(line.split()[:2] for line in proc.stdout.splitlines())
    assert float(values["buffer_frames_per_env"]) <= 2 * 16
    assert float(values["cpu_ms_per_finished_episode"]) > 0
