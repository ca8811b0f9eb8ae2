"""Tiny runs B and D (RLinf v0.3) and StarVLA's B (RLinf main) through RLinf's own training entry point
(train_embodied_agent.py).

scripts/run_tiny_experiments.sh runs what a user runs (Hydra composes the run config, Ray starts
the actor, rollout and env workers, the env workers step the real LIBERO-10 simulator, the runner
logs to TensorBoard), made small by Hydra overrides and, on this CPU-only machine, with the
test-only CPU shim (tests/rlinf_cpu_shim.patch) on a private copy of RLinf. Everything asserted
here is read from what the runner and the reward server wrote.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest

from reward_tools.launch import free_port
from tests.helpers.rlinf import LIBERO_VENV
from tests.helpers.servers import requests_counted
from tests.helpers.tiny_runs import (
    EPISODE_STEPS,
    REWARD_COEF,
    color_pixels,
    port_open,
    processes_mentioning,
    run_tiny,
    scalars,
    steps_flag,
    values,
)

# Training steps run by run: B trains twice, so its second rollout is judged after a training step
# and the weights' sync. The other runs are not here, each for what covers it (each cost this test
# ~80-190 s on the 2-core CI machine: docs/bench/cpu_suite_2026-12-07_ci_time, _engine_starts):
# - C: at tiny size B's judge (the script gives C the Qwen backend: random weights write no
#   <answer>) judged asynchronously on run C's config, which the fast tier composes
#   (tests/fast/test_rlinf_patch.py); its server's start and stop: tests/engine/test_experiment_scripts.py.
# - B3: run B's config with a Qwen3-VL judge; the script's B3 (its qwen3_vl server on the tiny
#   Qwen3-VL checkpoint) runs in test_experiment_scripts.py, the Qwen3-VL judge on both engines in
#   tests/engine/test_qwen3_vl.py, asynchronous judging through RLinf's entry point in run D.
# - A: LIBERO's own reward (RLinf's, with the judge off) on v0.3 and on main: the patched v0.3 env
#   with the judge off gives RLinf's original rewards (tests/libero/test_rlinf_integration.py), the
#   script's run A, which starts no server, runs in test_experiment_scripts.py, and
#   `run_tiny_experiments.sh --runs A` (or `--rlinf main --env starvla --runs A`) runs it whole.
STEPS = {"B": 2, "D": 1}
RUNS = tuple(STEPS)


@pytest.mark.timeout(1200)
def test_tiny_runs_b_d_through_rlinfs_entry_point(tmp_path):
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no LIBERO environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    args = ["--out", str(out), "--runs", ",".join(RUNS), *steps_flag(STEPS), "--port", str(port)]
    run_tiny(args, tmp_path, timeout=1140)
    assert not processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not port_open(port), "the reward server outlived the script"

    runs = {run: scalars(Path((out / f"run{run}" / "log_path").read_text().strip())) for run in RUNS}

    def logged(run: str, tag: str) -> np.ndarray:
        return values(runs[run], tag, STEPS[run])

    # Run B judges synchronously (the script's override)
    run = "B"
    scores = logged(run, "env/vlm_score")
    assert np.all((scores > 0) & (scores < 1)), scores
    assert np.all(logged(run, "env/vlm_fallback") == 0)
    assert np.all(logged(run, "env/vlm_latency_ms") > 0)
    assert np.all(logged(run, "env/success_once") == 0)  # both envs end by truncation at the last step
    # the env's return is reward_coef x score, given once, at the first done step
    assert np.allclose(logged(run, "env/return"), REWARD_COEF * scores, rtol=1e-4)
    # ... and that is the reward the actor trained on: its mean over the trained samples
    # (every step up to the first done, the last one here) times the steps per episode
    trained = logged(run, "rollout/rewards")
    assert np.allclose(trained * EPISODE_STEPS, REWARD_COEF * scores, rtol=1e-4), (trained, scores)
    assert not any(math.isnan(v) for v in trained)  # the group (two different scores) is kept
    assert np.all(logged(run, "rollout/advantages_max") > 0)
    # both envs end in the same step of each rollout: one batch request per step, no single ones
    served = (out / f"run{run}" / "server_metrics.txt").read_text()
    assert requests_counted(served, "/score/batch") == STEPS[run]
    assert requests_counted(served, "/score") == 0

    # Run D: PPO on the judge's 8-point progress curves, judged asynchronously (the run config):
    # the env worker patch placed the terminal reward at the done step and moved each point's gain
    # back to its step in the rollout buffer; what the actor trained on sums to reward_coef x score
    # and the logged return is reward_coef x score, as synchronously.
    scores = logged("D", "env/vlm_score")
    assert np.all((scores > 0) & (scores < 1)) and np.all(logged("D", "env/vlm_fallback") == 0)
    assert np.allclose(logged("D", "env/return"), REWARD_COEF * scores, rtol=1e-4)
    trained = logged("D", "rollout/rewards")
    assert np.allclose(trained * EPISODE_STEPS, REWARD_COEF * scores, rtol=1e-4), (trained, scores)
    assert np.all(logged("D", "env/vlm_moved_reward") > 0)  # placed before the done step
    assert np.all(np.isfinite(logged("D", "rollout/advantages_max")))
    served = (out / "runD" / "server_metrics.txt").read_text()
    assert requests_counted(served, "/score/batch") == STEPS["D"]
    points = re.search(r"^reward_curve_points_total (\S+)$", served, re.M)
    assert points and float(points.group(1)) == STEPS["D"] * 2 * 8  # 2 envs a step, 8 points each

    summary = (out / "summary.txt").read_text()
    groups = re.findall(r"^(A|B3|B|C|D)\s+(\d)\s.*\s(kept|dropped)$", summary, re.M)
    expected = [(run, str(step), "kept") for run in RUNS for step in range(STEPS[run])]
    assert sorted(groups) == sorted(expected)

    png = out / "compare.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["run"] for r in rows if r["metric"] == "env/return"} == set(RUNS)
    # matplotlib C0, C1: B, D (compare_runs colours the runs in the order given)
    for color in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        assert color_pixels(png, color) > 100, color


STARVLA_COEF = 1.0  # env.train.reward_coef in the StarVLA run configs (StarVLA's own: algorithm.reward_coef)
STARVLA_STEPS = {"B": 2}


@pytest.mark.timeout(1200)
def test_tiny_starvla_run_b_through_rlinf_mains_entry_point(tmp_path):
    """RLinf main's own train_embodied_agent.py with the StarVLA run B config on LIBERO-10: main's
    LiberoEnv, env worker (patched by rlinf_patches/main/) and GRPO, StarVLA's 8-action chunks and
    chunk-level rewards. StarVLA's 3B QwenOFT cannot run on this CPU: RLinf's
    mlp_policy stands in for it with StarVLA's chunking (the script's TINY_STARVLA); LIBERO-10
    task 8, because only LIBERO-10's assets are on these machines."""
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no LIBERO environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    args = ["--rlinf", "main", "--env", "starvla", "--runs", "B", *steps_flag(STARVLA_STEPS), "--out", str(out)]
    args += ["--port", str(port)]
    log = run_tiny(args, tmp_path, timeout=1140)  # ~5 min on 2 quiet cores; 14 min seen at load 14
    assert "rlinf: main" in log
    assert not processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not port_open(port), "the reward server outlived the script"
    log_path = (out / "runB" / "log_path").read_text().strip()
    assert "libero_10_grpo_starvla_runB_qwen" in log_path  # RLinf main's own StarVLA config, made tiny
    runs = {"B": scalars(Path(log_path))}

    def logged(run: str, tag: str) -> np.ndarray:
        return values(runs[run], tag, STARVLA_STEPS[run])

    # Run B: the judge's score, once, at the episode's end (truncation at step 16, chunk step 2)
    scores = logged("B", "env/vlm_score")
    assert np.all((scores > 0) & (scores < 1)), scores
    assert np.all(logged("B", "env/vlm_fallback") == 0)
    assert np.all(logged("B", "env/vlm_latency_ms") > 0)
    assert np.all(logged("B", "env/success_once") == 0)
    assert np.allclose(logged("B", "env/return"), STARVLA_COEF * scores, rtol=1e-4)
    # what the actor trained on: rollout/rewards is the mean over the rollout's step rewards (2 chunk
    # steps x 8 actions per env), the bonus once per episode, in its last chunk: x 16 = the score
    trained = logged("B", "rollout/rewards")
    assert np.allclose(trained * EPISODE_STEPS, STARVLA_COEF * scores, rtol=1e-4), (trained, scores)
    assert np.all(logged("B", "rollout/advantages_max") > 0)  # the group's two scores differ
    served = (out / "runB" / "server_metrics.txt").read_text()
    assert requests_counted(served, "/score/batch") == STARVLA_STEPS["B"]  # both envs end together: one batch a step
    assert requests_counted(served, "/score") == 0
