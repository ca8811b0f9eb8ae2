"""Tiny run B of the ManiSkill configs through RLinf's own training entry point
(scripts/run_tiny_experiments.sh --env maniskill), on RLinf v0.3 and main: RLinf's PPO with its
MLP policy on PickCube-v1, ManiSkill's CPU physics rendering on lavapipe. Everything asserted here
is read from what the runner and the reward server wrote. Run A (ManiSkill's own reward) is
checked on the patched env (tests/maniskill/test_rlinf_maniskill.py); through the whole loop it
would be RLinf's PPO alone, for ~100 s of the 2-core CI machine (docs/bench/cpu_suite_2026-12-07_ci_time)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from reward_tools.launch import free_port
from tests.helpers.rlinf import LIBERO_VENV
from tests.helpers.servers import requests_counted
from tests.helpers.tiny_runs import (
    TRAIN_STEPS,
    port_open,
    processes_mentioning,
    run_tiny,
    scalars,
    values,
)

MANISKILL_COEF = 1.0  # env.train.reward_coef in the ManiSkill run configs


@pytest.mark.timeout(600)
def test_tiny_maniskill_run_b_through_rlinfs_entry_point(tmp_path):
    """Run B (the judge) of the ManiSkill configs: RLinf's PPO with its MLP policy on PickCube-v1,
    one env, 16 steps, 2 training steps (the script's TINY_MANISKILL; the second rollout is judged
    after a training step and the weights' sync), ManiSkill's CPU physics rendering on lavapipe."""
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no simulator environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    run_tiny(["--env", "maniskill", "--runs", "B", "--out", str(out), "--port", str(port)], tmp_path, timeout=480)
    assert not processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not port_open(port), "the reward server outlived the script"
    b = scalars(Path((out / "runB" / "log_path").read_text().strip()))

    # Run B: the judge's score, given once, at the episode's end (truncation at step 16), judged
    # asynchronously (the run config): placed by the env worker, counted in the return it logs
    scores = values(b, "env/vlm_score")
    assert np.all((scores > 0) & (scores < 1)), scores
    assert np.all(values(b, "env/vlm_fallback") == 0)
    assert np.all(values(b, "env/vlm_latency_ms") > 0)
    assert np.all(values(b, "env/success_once") == 0)  # ManiSkill's flag: a random policy never succeeds
    assert np.allclose(values(b, "env/return"), MANISKILL_COEF * scores, rtol=1e-4)
    # PPO trained on it, plus the critic's bootstrap at the truncated step (bootstrap_type: always),
    # so rollout/rewards is not the env's reward alone here
    assert np.all(np.isfinite(values(b, "rollout/rewards")))
    assert "env/vlm_audit/episodes" in b  # audited against ManiSkill's success flag
    served = (out / "runB" / "server_metrics.txt").read_text()
    assert requests_counted(served, "/score/batch") == TRAIN_STEPS  # one batch request per step that ended episodes
    assert requests_counted(served, "/score") == 0

    png = out / "compare.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    assert re.findall(r"^([AB])\s+(\d)\s", (out / "summary.txt").read_text(), re.M) == [
        ("B", str(step)) for step in range(TRAIN_STEPS)
    ]


@pytest.mark.timeout(600)
def test_tiny_maniskill_run_b_through_rlinf_mains_entry_point(tmp_path):
    """Run B of the ManiSkill configs on RLinf main (rlinf_patches/main/maniskill_env.patch after
    main's own step() moved the actions to the device), judged asynchronously by the run config:
    the env worker patch on main's trajectory builders places the score."""
    if not (LIBERO_VENV / "bin" / "python").exists():
        pytest.skip(f"no simulator environment at {LIBERO_VENV} (bash scripts/setup_libero_env.sh)")
    out = tmp_path / "tiny"
    port = free_port()
    # one training step: the test above and the StarVLA test judge a second rollout after a training step
    args = ["--rlinf", "main", "--env", "maniskill", "--runs", "B", "--steps", "1", "--out", str(out)]
    args += ["--port", str(port)]
    log = run_tiny(args, tmp_path, timeout=480)
    assert "rlinf: main" in log
    assert not processes_mentioning(str(out)), "RLinf or Ray processes outlived the script"
    assert not port_open(port), "the reward server outlived the script"
    b = scalars(Path((out / "runB" / "log_path").read_text().strip()))
    scores = values(b, "env/vlm_score", 1)
    assert np.all((scores > 0) & (scores < 1)), scores
    assert np.all(values(b, "env/vlm_fallback", 1) == 0)
    assert np.allclose(values(b, "env/return", 1), MANISKILL_COEF * scores, rtol=1e-4)
    assert np.all(np.isfinite(values(b, "rollout/rewards", 1)))
    served = (out / "runB" / "server_metrics.txt").read_text()
    assert requests_counted(served, "/score/batch") == 1
    assert requests_counted(served, "/score") == 0
