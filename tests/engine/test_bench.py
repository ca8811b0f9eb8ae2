"""The benchmark's short mode on the vLLM engine: every path measured in one run, the report
docs/performance.md quotes. It measures the session's vLLM server (--url; a vLLM start costs ~60 s
on the 2-core machine); test_engine_profile.py runs the bench with --launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.scripts import failure_text


def test_bench_short_mode_measures_every_path_in_one_run(vllm_server, video_dir, tmp_path):
    out = tmp_path / "bench.json"
    paths = ["hook_raw", "hook_json", "hook_mp4", "concurrent", "sequential"]
    args = ["--url", vllm_server.url, "--n", "4", "--styles", "logprob", "gen8", "--paths", *paths]
    proc = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench", *args, "--repeats", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TMPDIR": str(video_dir)},  # hook_mp4's videos, under the server's --video-root
    )
    assert proc.returncode == 0, failure_text(proc.stderr)
    header, *rows = [
        line for line in proc.stdout.splitlines() if line.split()[:1] and line.split()[0] in ("path", *paths)
    ]
    assert header.split()[:4] == ["path", "style", "N", "eps/s"]
    assert len(rows) == len(paths) * 2
    report = json.loads(out.read_text())
    assert report["server"]["status"] == "ok" and report["server"]["engine"] == "vllm"
    results = report["results"]
    assert {(r["path"], r["style"]) for r in results} == {(p, s) for p in paths for s in ("logprob", "gen8")}
    for r in results:
        assert r["errors"] == 0 and r["episodes_per_s"] > 0 and r["n"] == 4
        stages = r["stages"]
        assert stages["total_ms"] >= stages["engine_ms"] > 0 and stages["receive_ms"] >= 0
        # the episode whose bytes arrived first: its own stages, none later than the batch's largest
        first, largest = r["first"], r["stages_max"]
        assert first["receive_ms"] <= stages["receive_ms"] and 0 < first["engine_ms"] <= largest["engine_ms"]
    by_path = {(r["path"], r["style"]): r for r in results}
    assert by_path[("hook_raw", "logprob")]["request_mib"] == pytest.approx(4 * 16 * 256 * 256 * 3 / 2**20, rel=0.01)
    # one table from the raw engine, server and peer files (here: server only)
    table = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench_report", str(out)], capture_output=True, text=True, check=True
    ).stdout
    assert table.count("\n") == len(results) + 2 and "| hook_raw [bench] | logprob | 4 |" in table
