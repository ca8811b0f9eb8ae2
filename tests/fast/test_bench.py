"""The benchmarks run in a short mode on CPU and print / write what docs/performance.md quotes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_client_bench_reports_bounded_buffers_and_cpu_per_episode():
    proc = subprocess.run(
        [sys.executable, "-m", "reward_tools.benchmarks.client", "--envs", "4", "--steps", "64", "--size", "64"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    values = dict(line.split()[:2] for line in proc.stdout.splitlines())
    assert float(values["buffer_frames_per_env"]) <= 2 * 16
    assert float(values["raw_cpu_ms_per_finished_episode"]) > 0
    assert float(values["inline_cpu_ms_per_finished_episode"]) > 0
    assert float(values["raw_batch_body_mib"]) < float(values["inline_batch_body_mib"])  # no base64


def test_first_batch_mode_reports_the_first_batch_against_steady_ones(tmp_path):
    out = tmp_path / "first.json"
    launch = "--engine fake --engine-option delay_ms=30 --warmup --warmup-batch 2 --warmup-frames 4 --warmup-size 64"
    args = ["--launch", launch, "--first-batch", "--n", "3", "--styles", "logprob", "--repeats", "2", "--size", "64"]
    proc = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)
    assert printed == json.loads(out.read_text())["first_batch"]
    assert printed["n"] == 3 and printed["style"] == "logprob" and printed["errors"] == 0
    assert printed["first_s"] > 0 and len(printed["steady_s"]) == 2
    assert printed["first_over_steady"] == pytest.approx(printed["first_s"] / printed["steady_median_s"])
    assert printed["warmup"]["episodes"] == 4 and printed["warmup"]["size"] == 64  # auto + logprob, 2 each


def test_curve_bench_measures_every_row_in_one_run(tmp_path):
    """The curve benchmark's short mode against the fake engine: one row per way and K, the
    server's counters per row, VOC of the three kinds of episode."""
    out = tmp_path / "curves.json"
    args = ["--launch", "--engine fake", "--n", "3", "--points", "4", "8", "--repeats", "1", "--size", "56"]
    proc = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench_curves", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    rows = {(r["way"], r["k"]): r for r in report["rows"]}
    assert set(rows) == {("curve", 1), ("curve", 4), ("curve", 8), ("plain", 4), ("plain", 8)}
    assert rows[("curve", 1)]["over_k1"] == 1.0
    for (_, k), r in rows.items():
        assert r["errors"] == 0 and r["n"] == 3 and r["requests"] == 3 * k and r["prompt_tokens"] > 0
        assert r["unparsed"] == 0  # the fake engine always answers a number
        # the fake engine has no prefix cache: a curve computes every point's whole prompt
        assert r["computed"] == r["prompt_tokens"] and len(r["walls_s"]) == 1
        base = rows[("curve", 1)]["prompt_tokens"]
        assert r["computed_over_k1"] == pytest.approx(r["prompt_tokens"] / base, abs=1e-3)
        assert r["wall_over_tokens"] == pytest.approx(r["over_k1"] / r["computed_over_k1"], abs=2e-3)
    assert set(report["voc"]) == {"k", "moving", "static", "reversed"} and report["voc"]["k"] == 8
