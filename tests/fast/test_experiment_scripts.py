"""scripts/run_experiments.sh and scripts/compare_runs.py against a patched RLinf tree.

RLinf's own launcher (run_embodiment.sh) needs GPUs, Ray and OpenVLA-OFT weights, so here a
scripted stand-in takes its place: it records which reward server it could reach and writes
TensorBoard curves where RLinf would. The reward servers are real (transformers engine, tiny
checkpoint).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from reward_tools.launch import free_port
from tests.helpers.rlinf import APPLY, unpack
from tests.helpers.servers import CPU_PRESET

REPO = Path(__file__).resolve().parents[2]

STAND_IN_LAUNCHER = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    # stand-in for RLinf's run_embodiment.sh: no training, only what the experiment script relies on
    set -eu
    config=$1
    log_dir="logs/$(date +%Y%m%d-%H%M%S%N)-$config"
    mkdir -p "$log_dir"
    health=$(curl -s "http://127.0.0.1:$REWARD_PORT/health" || echo none)
    echo "$health" > "$log_dir/reward_health.json"
    [ "${FAIL_CONFIG:-}" = "$config" ] && { echo "training crashed" >&2; exit 1; }
    python - "$log_dir" "$config" <<'PY'
    import sys, math
    from torch.utils.tensorboard import SummaryWriter
    log_dir, config = sys.argv[1], sys.argv[2]
    shift = {"runA": 0.0, "runB_qwen": 0.05, "runC_primo": 0.1}[config.split("openvlaoft_")[1]]
    w = SummaryWriter(f"{log_dir}/tensorboard")
    for step in range(0, 50, 5):
        w.add_scalar("env/success_once", min(1.0, 0.2 + shift + step / 100), step)
        w.add_scalar("env/return", 5 * (0.2 + shift + step / 100), step)
        if config != "libero_10_grpo_openvlaoft_runA":
            w.add_scalar("env/vlm_score", 0.3 + shift + 0.1 * math.sin(step / 10), step)
        if step % 10 == 0:
            w.add_scalar("eval/success_once", 0.1 + shift + step / 120, step)
    w.close()
    PY
    """
)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture()
def rlinf_tree(tmp_path) -> Path:
    tree = unpack(tmp_path / "rlinf")
    assert subprocess.run(["bash", str(APPLY), str(tree)], capture_output=True).returncode == 0
    launcher = tree / "examples" / "embodiment" / "run_embodiment.sh"
    launcher.write_text(STAND_IN_LAUNCHER)
    return tree


def _run_experiments(tree: Path, out: Path, checkpoint: str, port: int, **env) -> subprocess.CompletedProcess:
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
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=900)


@pytest.mark.engine
def test_runs_a_b_c_each_with_its_server_then_compare(rlinf_tree, tiny_checkpoint, tmp_path):
    port = free_port()
    out = tmp_path / "exp"
    result = _run_experiments(rlinf_tree, out, tiny_checkpoint, port)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not _port_open(port)  # every server stopped
    seen = {}
    for run in "ABC":
        log_path = Path((out / f"run{run}" / "log_path").read_text().strip())
        assert log_path.is_dir() and (log_path / "tensorboard").is_dir()
        seen[run] = (log_path / "reward_health.json").read_text()
    assert seen["A"].strip() == "none"  # no reward server during run A
    assert '"backend":"qwen2_5_vl_vllm"' in seen["B"] and '"status":"ok"' in seen["B"]
    assert '"backend":"PRIMO-R1"' in seen["C"]
    assert (out / "runB" / "reward_server.log").stat().st_size > 0
    assert (out / "runC" / "reward_server.log").is_file() and not (out / "runA" / "reward_server.log").exists()

    compare = subprocess.run(
        [
            "python",
            str(REPO / "scripts" / "compare_runs.py"),
            "--out",
            str(out / "compare"),
            *[f"--run={r}={(out / f'run{r}' / 'log_path').read_text().strip()}" for r in "ABC"],
        ],
        capture_output=True,
        text=True,
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


@pytest.mark.engine
def test_server_is_stopped_when_a_run_fails(rlinf_tree, tiny_checkpoint, tmp_path):
    port = free_port()
    result = _run_experiments(
        rlinf_tree, tmp_path / "exp", tiny_checkpoint, port, FAIL_CONFIG="libero_10_grpo_openvlaoft_runB_qwen"
    )
    assert result.returncode == 1
    assert "run B FAILED" in result.stderr
    assert not _port_open(port)


def test_unpatched_checkout_is_refused(tmp_path):
    tree = unpack(tmp_path / "rlinf")
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_experiments.sh"), str(tree), "--runs", "A"], capture_output=True, text=True
    )
    assert result.returncode == 1 and "is not patched" in result.stderr


STAND_IN_ENTRY_POINT = textwrap.dedent(
    """\
    # stand-in for train_embodied_agent.py: records how it was started, leaves a child behind
    import json, os, subprocess, sys
    args = sys.argv[1:]
    log_path = next(a.split("=", 1)[1] for a in args if a.startswith("runner.logger.log_path="))
    child = subprocess.Popen(["sleep", "300"])  # like a Ray process the driver did not stop
    env = {k: os.environ.get(k) for k in ("EMBODIED_PATH", "PYTHONPATH", "ROBOT_PLATFORM", "MUJOCO_GL")}
    with open(os.path.join(log_path, "started.json"), "w") as f:
        json.dump({"args": args, "env": env, "cwd": os.getcwd(), "child": child.pid}, f)
    """
)


def test_overrides_start_the_entry_point_as_run_embodiment_does(rlinf_tree, tmp_path):
    (rlinf_tree / "examples" / "embodiment" / "train_embodied_agent.py").write_text(STAND_IN_ENTRY_POINT)
    out = tmp_path / "exp"
    env = {**os.environ, "RLINF_PYTHON": "python", "RUN_TIMEOUT_S": "60", "PYTHONPATH": "/extra"}
    cmd = ["bash", str(REPO / "scripts" / "run_experiments.sh"), str(rlinf_tree), "--runs", "A", "--out", str(out)]
    result = subprocess.run(
        [*cmd, "--", "algorithm.group_size=2", "D:algorithm.update_epoch=1", "+env.train.x=1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    log_path = Path((out / "runA" / "log_path").read_text().strip())
    started = json.loads((log_path / "started.json").read_text())
    embodied = rlinf_tree / "examples" / "embodiment"
    assert started["args"] == [
        "--config-path",
        f"{embodied}/config/",
        "--config-name",
        "libero_10_grpo_openvlaoft_runA",
        f"runner.logger.log_path={log_path}",
        "algorithm.group_size=2",
        "+env.train.x=1",
    ]  # run A asks no reward server: no URL override; run D's own override is D's alone
    assert log_path.parent == rlinf_tree / "logs" and log_path.name.endswith("-libero_10_grpo_openvlaoft_runA")
    assert started["env"] == {
        "EMBODIED_PATH": str(embodied),
        "PYTHONPATH": f"{rlinf_tree}:/extra",
        "ROBOT_PLATFORM": "LIBERO",
        "MUJOCO_GL": "egl",
    }
    assert started["cwd"] == str(rlinf_tree)
    assert not Path(f"/proc/{started['child']}").exists()  # what the run left behind was stopped
