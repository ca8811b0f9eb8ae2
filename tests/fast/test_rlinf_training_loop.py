"""Tiny runs A, B, C and D through RLinf's own training entry point (train_embodied_agent.py).

scripts/run_tiny_experiments.sh runs what a user runs (Hydra composes the run config, Ray starts
the actor, rollout and env workers, the env workers step the real LIBERO-10 simulator, the runner
logs to TensorBoard), made small by Hydra overrides and, on this CPU-only machine, with the
test-only CPU shim (tests/rlinf_cpu_shim.patch) on a private copy of RLinf. Everything asserted
here is read from what the runner and the reward server wrote.
"""

from __future__ import annotations

import csv
import math
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from reward_tools.launch import free_port
from tests.fast.test_rlinf_integration import LIBERO_VENV, SHARED_CONFIGS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "run_tiny_experiments.sh"
REWARD_COEF = 5.0  # env.train.reward_coef in the run configs (RLinf's libero_10 default)
EPISODE_STEPS = 16  # env.train.max_episode_steps in the script's tiny overrides
TRAIN_STEPS = 2  # runner.max_epochs in the tiny overrides
FILTER_BOUNDS = (0.001, REWARD_COEF - 0.001)  # algorithm.rewards_*_bound in the run configs


def _scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, dict[int, float]] = {}
    for events in sorted((log_dir / "tensorboard").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            series.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return series


def _values(series: dict[str, dict[int, float]], tag: str) -> np.ndarray:
    assert tag in series, f"{tag} not logged; logged: {sorted(t for t in series if not t.startswith('time/'))}"
    points = series[tag]
    assert sorted(points) == list(range(TRAIN_STEPS)), points
    return np.array([points[step] for step in range(TRAIN_STEPS)])


def _server_count(metrics_text: str, route: str) -> float:
    pattern = rf'^reward_requests_total\{{code="200",route="{re.escape(route)}"\}} (\S+)$'
    match = re.search(pattern, metrics_text, re.M)
    return float(match.group(1)) if match else 0.0


def _processes_mentioning(marker: str) -> list[int]:
    """Processes whose environment names `marker`: the runs' RLinf tree is on their PYTHONPATH,
    Ray's workers (renamed `ray::...`) included."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _color_pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((np.abs(pixels - np.array(rgb)).sum(axis=-1) < 30).sum())


def _run_tiny(args: list[str], tmp_path: Path, timeout: float = 840) -> str:
    """scripts/run_tiny_experiments.sh with args; its output (also in tmp_path/script.log)."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")},
        "LIBERO_VENV": str(LIBERO_VENV),
        "RLINF_EXAMPLES": str(SHARED_CONFIGS.parent.parent),
        "PYTHON": sys.executable,
    }
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # the scripts' traps stop the server and RLinf's Ray session
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    (tmp_path / "script.log").write_text(output)
    assert proc.returncode == 0, output[-5000:]
    return output


def test_readme_tiny_command_is_this_script():
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- front-door:tiny -->", 1)[1].split("```", 2)[1]
    command = block.splitlines()[1]
    assert command.startswith(f"bash {SCRIPT.relative_to(REPO)} "), command


@pytest.mark.libero
@pytest.mark.timeout(1200)
def test_tiny_runs_a_b_c_d_through_rlinfs_entry_point(tmp_path):
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no LIBERO environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    _run_tiny(["--out", str(out), "--port", str(port)], tmp_path, timeout=1140)
    assert not _processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not _port_open(port), "the reward server outlived the script"

    runs = {run: _scalars(Path((out / f"run{run}" / "log_path").read_text().strip())) for run in "ABCD"}

    # Run A: LIBERO's own reward, no judge. A random policy fails both envs of the one group, so
    # the group has no spread and filter_rewards drops it: RLinf trains on no sample.
    a = runs["A"]
    assert not [tag for tag in a if tag.startswith("env/vlm_")]
    assert np.allclose(_values(a, "env/return"), REWARD_COEF * _values(a, "env/success_once"))
    assert np.all(_values(a, "env/return") < FILTER_BOUNDS[0])
    assert np.all(np.isnan(_values(a, "rollout/rewards")))

    for run in "BC":  # B judges synchronously (the script's override), C asynchronously: the same checks
        s = runs[run]
        scores = _values(s, "env/vlm_score")
        assert np.all((scores > 0) & (scores < 1)), scores
        assert np.all(_values(s, "env/vlm_fallback") == 0)
        assert np.all(_values(s, "env/vlm_latency_ms") > 0)
        assert np.all(_values(s, "env/success_once") == 0)  # both envs end by truncation at the last step
        # the env's return is reward_coef x score, given once, at the first done step
        assert np.allclose(_values(s, "env/return"), REWARD_COEF * scores, rtol=1e-4)
        # ... and that is the reward the actor trained on: its mean over the trained samples
        # (every step up to the first done, the last one here) times the steps per episode
        trained = _values(s, "rollout/rewards")
        assert np.allclose(trained * EPISODE_STEPS, REWARD_COEF * scores, rtol=1e-4), (trained, scores)
        assert not any(math.isnan(v) for v in trained)  # the group (two different scores) is kept
        assert np.all(_values(s, "rollout/advantages_max") > 0)
        # both envs end in the same step of each rollout: one batch request per step, no single ones
        served = (out / f"run{run}" / "server_metrics.txt").read_text()
        assert _server_count(served, "/score/batch") == TRAIN_STEPS
        assert _server_count(served, "/score") == 0

    # Run D: PPO on the judge's 8-point progress curves, judged asynchronously (the run config):
    # the env worker patch placed the terminal reward at the done step and moved each point's gain
    # back to its step in the rollout buffer; what the actor trained on sums to reward_coef x score
    # and the logged return is reward_coef x score, as synchronously.
    d = runs["D"]
    scores = _values(d, "env/vlm_score")
    assert np.all((scores > 0) & (scores < 1)) and np.all(_values(d, "env/vlm_fallback") == 0)
    assert np.allclose(_values(d, "env/return"), REWARD_COEF * scores, rtol=1e-4)
    trained = _values(d, "rollout/rewards")
    assert np.allclose(trained * EPISODE_STEPS, REWARD_COEF * scores, rtol=1e-4), (trained, scores)
    assert np.all(_values(d, "env/vlm_moved_reward") > 0)  # placed before the done step
    assert np.all(np.isfinite(_values(d, "rollout/advantages_max")))
    served = (out / "runD" / "server_metrics.txt").read_text()
    assert _server_count(served, "/score/batch") == TRAIN_STEPS
    points = re.search(r"^reward_curve_points_total (\S+)$", served, re.M)
    assert points and float(points.group(1)) == TRAIN_STEPS * 2 * 8  # 2 envs a step, 8 points each

    assert not (out / "runA" / "reward_server.log").exists()  # no judge in run A

    summary = (out / "summary.txt").read_text()
    groups = re.findall(r"^([ABCD])\s+(\d)\s.*\s(kept|dropped)$", summary, re.M)
    expected = [(run, str(step), "dropped" if run == "A" else "kept") for run in "ABCD" for step in range(TRAIN_STEPS)]
    assert sorted(groups) == sorted(expected)

    png = out / "compare.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["run"] for r in rows if r["metric"] == "env/return"} == {"A", "B", "C", "D"}
    # matplotlib C0, C1, C2, C3: A, B, C, D
    for color in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28)):
        assert _color_pixels(png, color) > 100, color


MANISKILL_COEF = 1.0  # env.train.reward_coef in the ManiSkill run configs


@pytest.mark.maniskill
@pytest.mark.timeout(600)
def test_tiny_maniskill_runs_native_and_judged_through_rlinfs_entry_point(tmp_path):
    """Runs A (ManiSkill's dense reward) and B (the judge) of the ManiSkill configs: RLinf's PPO
    with its MLP policy on PickCube-v1, one env, 16 steps, 2 training steps (the script's
    TINY_MANISKILL), ManiSkill's CPU physics rendering on lavapipe."""
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no simulator environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    _run_tiny(["--env", "maniskill", "--runs", "A,B", "--out", str(out), "--port", str(port)], tmp_path, timeout=480)
    assert not _processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not _port_open(port), "the reward server outlived the script"
    runs = {run: _scalars(Path((out / f"run{run}" / "log_path").read_text().strip())) for run in "AB"}

    # Run A: the simulator's own reward, ManiSkill's normalized dense reward at every step
    a = runs["A"]
    assert not [tag for tag in a if tag.startswith("env/vlm_")]
    assert np.all(_values(a, "env/return") > 0)
    assert np.all(np.isfinite(_values(a, "rollout/rewards")))

    # Run B: the judge's score, given once, at the episode's end (truncation at step 16), judged
    # asynchronously (the run config): placed by the env worker, counted in the return it logs
    b = runs["B"]
    scores = _values(b, "env/vlm_score")
    assert np.all((scores > 0) & (scores < 1)), scores
    assert np.all(_values(b, "env/vlm_fallback") == 0)
    assert np.all(_values(b, "env/vlm_latency_ms") > 0)
    assert np.all(_values(b, "env/success_once") == 0)  # ManiSkill's flag: a random policy never succeeds
    assert np.allclose(_values(b, "env/return"), MANISKILL_COEF * scores, rtol=1e-4)
    # PPO trained on it, plus the critic's bootstrap at the truncated step (bootstrap_type: always),
    # so rollout/rewards is not the env's reward alone here
    assert np.all(np.isfinite(_values(b, "rollout/rewards")))
    assert "env/vlm_audit/episodes" in b  # audited against ManiSkill's success flag
    served = (out / "runB" / "server_metrics.txt").read_text()
    assert _server_count(served, "/score/batch") == TRAIN_STEPS  # one batch request per step that ended episodes
    assert _server_count(served, "/score") == 0

    png = out / "compare.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    assert re.findall(r"^([AB])\s+(\d)\s", (out / "summary.txt").read_text(), re.M) == [
        (run, str(step)) for run in "AB" for step in range(TRAIN_STEPS)
    ]
