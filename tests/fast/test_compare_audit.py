"""compare_runs.py's audit figure: runs B and C side by side on the live judge audit's scalars."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _write_run(log_path: Path, audit: bool, shift: float) -> None:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(log_path / "tensorboard"))
    for step in range(0, 30, 10):
        w.add_scalar("env/success_once", 0.2 + step / 100, step)
        if audit:  # the keys the hook puts in infos["episode"], as RLinf logs them
            w.add_scalar("env/vlm_audit/auroc", 0.6 + shift, step)
            w.add_scalar("env/vlm_audit/fpr", 0.3 - shift, step)
            w.add_scalar("env/vlm_audit/task0/auroc", 0.7 + shift, step)
            w.add_scalar("env/vlm_audit/task3/best_threshold", 0.4, step)
            w.add_scalar("env/vlm_canary/static", 0.2 + shift + step / 1000, step)
            w.add_scalar("env/vlm_canary/real_success", 0.8, step)
    w.close()


def test_audit_scalars_of_b_and_c_side_by_side(tmp_path):
    for name, audit, shift in (("A", False, 0.0), ("B", True, 0.0), ("C", True, 0.1)):
        _write_run(tmp_path / name, audit, shift)
    out = tmp_path / "cmp" / "abc"
    runs = [f"--run={n}={tmp_path / n}" for n in "ABC"]
    result = subprocess.run(
        [sys.executable, "-m", "reward_tools.compare_runs", "--out", str(out), *runs],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "run A logs no judge audit" in result.stderr
    png = out.parent / "abc-audit.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
    with open(out.parent / "abc-audit.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["run"] for r in rows} == {"B", "C"}
    got = {(r["run"], r["metric"], int(r["step"])): float(r["value"]) for r in rows}
    assert got[("C", "env/vlm_audit/auroc", 20)] == pytest.approx(0.7)
    assert got[("B", "env/vlm_canary/static", 20)] == pytest.approx(0.22)
    assert got[("C", "env/vlm_audit/task3/best_threshold", 0)] == pytest.approx(0.4)
    assert (out.parent / "abc.png").is_file()  # the main comparison is still written
