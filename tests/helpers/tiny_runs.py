"""The tiny runs through RLinf's own training entry point (scripts/run_tiny_experiments.sh), and
what tests read back from them: the runner's TensorBoard scalars, the server's counts, the
processes and ports they leave (none), the plots they draw."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers.rlinf import LIBERO_VENV, SHARED_CONFIGS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "run_tiny_experiments.sh"
REWARD_COEF = 5.0  # env.train.reward_coef in the run configs (RLinf's libero_10 default)
EPISODE_STEPS = 16  # env.train.max_episode_steps in the script's tiny overrides
TRAIN_STEPS = 2  # runner.max_epochs in the tiny overrides, unless --steps says otherwise


def scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, dict[int, float]] = {}
    for events in sorted((log_dir / "tensorboard").rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            series.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return series


def values(series: dict[str, dict[int, float]], tag: str, steps: int = TRAIN_STEPS) -> np.ndarray:
    """One run's `tag` at each of its `steps` training steps (all of them logged, no other)."""
    assert tag in series, f"{tag} not logged; logged: {sorted(t for t in series if not t.startswith('time/'))}"
    points = series[tag]
    assert sorted(points) == list(range(steps)), points
    return np.array([points[step] for step in range(steps)])


def steps_flag(steps: dict[str, int]) -> list[str]:
    """The script's --steps for these training steps run by run, e.g. {"A": 1, "B": 2} -> A=1,B=2.
    A second training step cost tiny run A ~25 s on the 2-core machine (docs/bench/
    cpu_suite_2026-12-07_ci_time): the tests run one only where they assert what it adds (a
    rollout judged after the policy was trained and its weights synced)."""
    return ["--steps", ",".join(f"{run}={n}" for run, n in steps.items())]


def processes_mentioning(marker: str) -> list[int]:
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


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def color_pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((np.abs(pixels - np.array(rgb)).sum(axis=-1) < 30).sum())


def run_tiny(args: list[str], tmp_path: Path, timeout: float = 840) -> str:
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
