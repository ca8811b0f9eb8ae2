"""reward_tools.fidelity: the same episodes scored by two servers, compared (rank correlation,
absolute differences), on the fake engine (fast tier)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reward_tools.fidelity import compare_scores
from tests.helpers.servers import InProcessServer


def test_compare_scores_by_hand():
    report = compare_scores([0.1, 0.5, 0.9, None], [0.5, 0.4, 0.95, 0.3])
    assert report["episodes"] == 4 and report["compared"] == 3
    assert report["unscored_a"] == 1 and report["unscored_b"] == 0
    assert report["spearman"] == pytest.approx(0.5)  # ranks (1, 2, 3) vs (2, 1, 3): 1 - 6 * 2 / (3 * 8)
    assert report["max_abs_diff"] == pytest.approx(0.4)
    assert report["mean_abs_diff"] == pytest.approx((0.4 + 0.1 + 0.05) / 3)
    with pytest.raises(ValueError, match="different numbers"):
        compare_scores([0.1], [0.1, 0.2])


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reward_tools.fidelity", *args], capture_output=True, text=True, timeout=120
    )


def test_the_same_server_twice_agrees_exactly_and_files_stand_for_servers(tmp_path):
    workload = ["--n", "6", "--frames", "4", "--size", "64", "--batch", "4"]
    with InProcessServer() as server:
        saved = tmp_path / "a.json"
        assert run("scores", "--url", server.url, "--out", str(saved), *workload).returncode == 0
        both = run("compare", server.url, str(saved), *workload, "--out", str(tmp_path / "report.json"))
    assert both.returncode == 0, both.stderr[-2000:]
    report = json.loads(both.stdout)
    assert report == json.loads((tmp_path / "report.json").read_text())
    assert report["compared"] == 6 and report["spearman"] == pytest.approx(1.0)
    assert report["max_abs_diff"] == 0.0 and report["a"]["engine"] == "fake" and report["b"]["file"] == str(saved)
    scores = json.loads(saved.read_text())["scores"]
    assert len(set(scores)) == 6 and all(0 < s < 1 for s in scores)  # distinct episodes, real logprob scores
    # a different workload is refused, not compared
    other = run("compare", str(saved), str(saved), "--n", "7")
    assert other.returncode == 0  # both files: the workload is theirs, and equal
    mismatch = tmp_path / "b.json"
    mismatch.write_text(json.dumps({**json.loads(saved.read_text()), "size": 128}))
    refused = run("compare", str(saved), str(mismatch))
    assert refused.returncode == 2 and "different workloads" in refused.stderr
