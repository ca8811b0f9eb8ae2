"""scripts/run_experiments.sh and reward_tools/compare_runs.py against a patched RLinf tree.

RLinf's own launcher (run_embodiment.sh) needs GPUs, Ray and OpenVLA-OFT weights, so here a
scripted stand-in takes its place (tests/helpers/rlinf.py): an unpatched checkout is refused, and
the overrides start RLinf's entry point as run_embodiment.sh does. The runs with real reward
servers are in tests/engine/test_experiment_scripts.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.rlinf import STAND_IN_ENTRY_POINT, stand_in_tree, unpack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def rlinf_tree(tmp_path) -> Path:
    return stand_in_tree(tmp_path / "rlinf")


def test_unpatched_checkout_is_refused(tmp_path):
    tree = unpack(tmp_path / "rlinf")
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_experiments.sh"), str(tree), "--runs", "A"], capture_output=True, text=True
    )
    assert result.returncode == 1 and "is not patched" in result.stderr


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
