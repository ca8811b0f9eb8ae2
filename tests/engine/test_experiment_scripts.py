"""scripts/run_experiments.sh with real reward servers (transformers engine, tiny checkpoints) for
runs A, B, B3 (the Qwen3-VL judge) and C, each with its own server, then compare; and the server
stopped when a run fails. RLinf's own launcher is a scripted stand-in (tests/helpers/rlinf.py)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from reward_tools.launch import free_port
from tests.helpers.rlinf import stand_in_tree
from tests.helpers.scripts import failure_text
from tests.helpers.servers import CPU_PRESET
from tests.helpers.tiny_runs import port_open

REPO = Path(__file__).resolve().parents[2]


def _working_in(tree: Path) -> list[int]:
    """Processes whose working directory is in the RLinf tree (the launcher runs there)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")).is_relative_to(tree):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.fixture()
def rlinf_tree(tmp_path) -> Path:
    return stand_in_tree(tmp_path / "rlinf")


def _run_experiments(
    tree: Path, out: Path, checkpoint: str, port: int, *args: str, **env
) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        "REWARD_SERVER_FLAGS": f"--config {CPU_PRESET} --engine hf",
        "REWARD_PORT": str(port),
        "HEALTH_TIMEOUT_S": "300",
        **env,
    }
    cmd = [
        "bash",
        str(REPO / "scripts" / "run_experiments.sh"),
        str(tree),
        "--qwen-model",
        checkpoint,
        "--primo-model",
        checkpoint,
        "--port",
        str(port),
        "--out",
        str(out),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=900)


def test_runs_a_b_b3_c_each_with_its_server_then_compare(rlinf_tree, tiny_checkpoint, tiny_qwen3_checkpoint, tmp_path):
    port = free_port()
    out = tmp_path / "exp"
    qwen3 = ("--runs", "A,B,B3,C", "--qwen3-model", tiny_qwen3_checkpoint)
    result = _run_experiments(rlinf_tree, out, tiny_checkpoint, port, *qwen3)
    assert result.returncode == 0, failure_text(result.stderr)
    assert not port_open(port)  # every server stopped
    seen = {}
    for run in ("A", "B", "B3", "C"):
        log_path = Path((out / f"run{run}" / "log_path").read_text().strip())
        assert log_path.is_dir() and (log_path / "tensorboard").is_dir()
        seen[run] = (log_path / "reward_health.json").read_text()
    assert seen["A"].strip() == "none"  # no reward server during run A
    assert '"backend":"qwen2_5_vl_vllm"' in seen["B"] and '"status":"ok"' in seen["B"]
    assert '"backend":"PRIMO-R1"' in seen["C"]
    # run B3: run B's config (runB3_qwen3) judged by the Qwen3-VL checkpoint on its own backend
    assert '"backend":"qwen3_vl"' in seen["B3"] and '"status":"ok"' in seen["B3"]
    assert "runB3_qwen3" in (out / "runB3" / "log_path").read_text()
    assert (out / "runB" / "reward_server.log").stat().st_size > 0
    assert (out / "runC" / "reward_server.log").is_file() and not (out / "runA" / "reward_server.log").exists()

    compare = subprocess.run(
        [
            "python",
            "-m",
            "reward_tools.compare_runs",
            "--out",
            str(out / "compare"),
            *[f"--run={r}={(out / f'run{r}' / 'log_path').read_text().strip()}" for r in "ABC"],
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert compare.returncode == 0, compare.stderr
    assert "run A does not log: env/vlm_score" in compare.stderr
    png = out / "compare.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    shutil.copy(png, Path(os.environ.get("COMPARE_PNG_COPY", tmp_path / "copy.png")))
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    metrics = {(r["run"], r["metric"]) for r in rows}
    assert ("A", "env/vlm_score") not in metrics and ("C", "env/vlm_score") in metrics
    assert ("B", "eval/success_once") in metrics
    b_success = [float(r["value"]) for r in rows if r["run"] == "B" and r["metric"] == "env/success_once"]
    assert len(b_success) == 10 and b_success[0] == pytest.approx(0.25)


def test_server_is_stopped_when_a_run_fails(rlinf_tree, tiny_checkpoint, tmp_path):
    port = free_port()
    result = _run_experiments(
        rlinf_tree, tmp_path / "exp", tiny_checkpoint, port, FAIL_CONFIG="libero_10_grpo_openvlaoft_runB_qwen"
    )
    assert result.returncode == 1
    assert "run B FAILED" in result.stderr
    assert not port_open(port)


def test_a_server_that_cannot_start_stops_the_run_beside_it(rlinf_tree, tmp_path):
    """RLinf starts while the server loads; its reward client would wait for /health for minutes
    (the stand-in: 120 s), so the script itself stops the run once the server has exited."""
    port = free_port()
    started = time.monotonic()
    result = _run_experiments(rlinf_tree, tmp_path / "exp", str(tmp_path / "no-such-checkpoint"), port, "--runs", "B")
    assert result.returncode == 1
    assert "reward server exited during startup" in result.stderr, result.stderr[-3000:]
    assert time.monotonic() - started < 100  # not the stand-in's 120 s wait for a server that is gone
    assert not _working_in(rlinf_tree), "the run outlived the script"
    assert not port_open(port)
