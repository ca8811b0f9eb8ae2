"""Tiny runs B, D and B3 (RLinf v0.3) and StarVLA's A and B (RLinf main) through RLinf's own training
entry point (train_embodied_agent.py).

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

# B3: run B's config with a Qwen3-VL judge (the qwen3_vl backend). Training steps run by run: B
# trains twice, so its second rollout is judged after a training step and the weights' sync.
# Not run C: at tiny size it is B's judge (the script gives C the Qwen backend: random weights write
# no <answer>) judged asynchronously, as B3 and D are, on run C's config, which the fast tier
# composes (tests/fast/test_rlinf_patch.py); its server's start and stop are in
# tests/engine/test_experiment_scripts.py. Run C cost 160 s of this test on the 2-core CI machine
# (docs/bench/cpu_suite_2026-12-07_ci_time). Not run A either: LIBERO's own reward through RLinf's
# entry point runs on RLinf main (the StarVLA test below), the patched v0.3 env with the judge off
# gives RLinf's original rewards (tests/libero/test_rlinf_integration.py), run A's config is composed
# by the fast tier and the script's run A, which starts no server, by test_experiment_scripts.py;
# it cost ~190 s here (docs/bench/cpu_suite_2026-12-07_engine_starts).
STEPS = {"B": 2, "D": 1, "B3": 1}
RUNS = tuple(STEPS)


@pytest.mark.timeout(1200)
def test_tiny_runs_b_d_b3_through_rlinfs_entry_point(tmp_path):
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no LIBERO environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    args = ["--out", str(out), "--runs", ",".join(RUNS), *steps_flag(STEPS), "--port", str(port)]
    log = run_tiny(args, tmp_path, timeout=1140)
    assert not processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not port_open(port), "the reward server outlived the script"

    runs = {run: scalars(Path((out / f"run{run}" / "log_path").read_text().strip())) for run in RUNS}

    def logged(run: str, tag: str) -> np.ndarray:
        return values(runs[run], tag, STEPS[run])

    # B judges synchronously (the script's override), B3 asynchronously: the same checks
    for run in ("B", "B3"):
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

    # run B3's judge was the Qwen3-VL checkpoint on its own backend, B's the Qwen2.5-VL one
    assert re.search(r"run B3: .*runB3_qwen3", log) and '"backend":"qwen3_vl"' in log
    assert "--backend qwen3_vl --model-path" in log and "judge_qwen3" in log

    summary = (out / "summary.txt").read_text()
    groups = re.findall(r"^(A|B3|B|C|D)\s+(\d)\s.*\s(kept|dropped)$", summary, re.M)
    expected = [(run, str(step), "kept") for run in RUNS for step in range(STEPS[run])]
    assert sorted(groups) == sorted(expected)

    png = out / "compare.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["run"] for r in rows if r["metric"] == "env/return"} == set(RUNS)
    # matplotlib C0 .. C2: B, D, B3 (compare_runs colours the runs in the order given)
    for color in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C)):
        assert color_pixels(png, color) > 100, color


STARVLA_COEF = 1.0  # env.train.reward_coef in the StarVLA run configs (StarVLA's own: algorithm.reward_coef)
STARVLA_STEPS = {"A": 1, "B": 2}


@pytest.mark.timeout(1200)
def test_tiny_starvla_runs_a_b_through_rlinf_mains_entry_point(tmp_path):
    """RLinf main's own train_embodied_agent.py with the StarVLA run configs on LIBERO-10, runs A
    and B: main's LiberoEnv, env worker (patched by rlinf_patches/main/) and GRPO, StarVLA's
    8-action chunks and chunk-level rewards. StarVLA's 3B QwenOFT cannot run on this CPU: RLinf's
    mlp_policy stands in for it with StarVLA's chunking (the script's TINY_STARVLA); LIBERO-10
    task 8, because only LIBERO-10's assets are on these machines."""
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no LIBERO environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    args = ["--rlinf", "main", "--env", "starvla", "--runs", "A,B", *steps_flag(STARVLA_STEPS), "--out", str(out)]
    args += ["--port", str(port)]
    log = run_tiny(args, tmp_path, timeout=1140)  # ~5 min on 2 quiet cores; 14 min seen at load 14
    assert "rlinf: main" in log
    assert not processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not port_open(port), "the reward server outlived the script"
    runs = {run: scalars(Path((out / f"run{run}" / "log_path").read_text().strip())) for run in "AB"}
    for run, config in (("A", "runA"), ("B", "runB_qwen")):  # RLinf main's own StarVLA config, made tiny
        assert f"libero_10_grpo_starvla_{config}" in (out / f"run{run}" / "log_path").read_text()

    # Run A: LIBERO's own reward; a random policy fails, StarVLA's config keeps every group (no filter)
    def logged(run: str, tag: str) -> np.ndarray:
        return values(runs[run], tag, STARVLA_STEPS[run])

    assert not [tag for tag in runs["A"] if tag.startswith("env/vlm_")]
    assert np.allclose(logged("A", "env/return"), STARVLA_COEF * logged("A", "env/success_once"))
    assert np.all(logged("A", "rollout/rewards") == 0)

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
