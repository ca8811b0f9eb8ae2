"""RLinf v0.3's ManiSkill env with the VLM reward: the patched ManiskillEnv on the real simulator
(the patch and the run configs: tests/fast/test_rlinf_maniskill_patch.py).

The env runs in the simulator's own Python environment (scripts/setup_libero_env.sh, which
calls scripts/setup_maniskill_env.sh: ManiSkill 3, SAPIEN rendering on Mesa's lavapipe on a
CPU machine) and talks over HTTP to the real app on the fake engine in this process, whose
engine keeps every video it was given: the frames the server received are compared with the
frames the env rendered. The fake engine answers the last frame's brightness as the score.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from reward_tools.launch import free_port
from tests.helpers.rlinf import simulator_env
from tests.helpers.servers import InProcessServer

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "maniskill_driver.py"
PICK_CUBE = "Pick up the red cube and place it on the green spot on the table."


# --- the patched ManiskillEnv on the real simulator ---------------------------------------------


def _drive(python: str, trees: dict, out: Path, *flags: str) -> dict:
    cmd = [python, str(DRIVER), "--rlinf-dir", str(trees["patched"]), "--config-dir", str(trees["config"])]
    proc = subprocess.run(
        [*cmd, "--out", str(out), *flags], capture_output=True, text=True, env=simulator_env(), timeout=600
    )
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    frames = np.load(f"{out}.frames.npz")
    result["frames"] = [frames[f"episode{i}"] for i in range(len(frames.files))]
    result["log"] = proc.stderr
    return result


COEF = 2.0
SIZE = 56  # on the model's 28-pixel grid: the server uses the frames as sent, no resize


def test_real_simulator_episodes_are_judged_with_their_own_frames(maniskill_python, rlinf_trees, tmp_path):
    with InProcessServer() as server:
        r = _drive(
            maniskill_python,
            rlinf_trees,
            tmp_path / "judged.json",
            *("--url", server.url, "--reward-coef", str(COEF), "--size", str(SIZE), "--nframes", "4"),
            *("--max-steps", "10", "--steps", "16", "--goal-step", "4"),
        )
        seen = list(server.engine.seen)
    assert r["patched"] and r["task"] == PICK_CUBE
    rewards, terms, truncs = (np.array(r[k]) for k in ("rewards", "terminations", "truncations"))
    # episode 1 succeeds (ManiSkill's own check) at step 4 and resets; episode 2 hits the limit at step 14
    assert np.flatnonzero(terms).tolist() == [3] and np.flatnonzero(truncs).tolist() == [13]
    first, second = r["done"]
    assert (first["step"], first["success"], second["step"], second["success"]) == (4, True, 14, False)
    scores = [first["episode"]["vlm_score"][0], second["episode"]["vlm_score"][0]]
    assert all(0 < s < 1 for s in scores)
    # the reward is reward_coef x score at each episode's done step, nothing before or after
    expected = np.zeros(16)
    expected[[3, 13]] = [COEF * s for s in scores]
    np.testing.assert_allclose(rewards, expected, rtol=1e-6)
    assert first["episode"]["return"][0] == pytest.approx(COEF * scores[0], rel=1e-6)
    assert r["counts"] == {**r["counts"], "episodes": 2, "scored": 2, "batches": 2, "fallbacks": 0}
    assert first["episode"]["vlm_fallback"] == [0.0] and second["episode"]["vlm_fallback"] == [0.0]
    assert first["episode"]["vlm_audit/score_success"][0] == pytest.approx(scores[0])  # ManiSkill's flag, audited

    # the server got each episode's own frames: from its first (reset) frame to its done step's
    assert len(seen) == 2
    for request, episode in zip(seen, r["frames"][:2], strict=True):
        video = request.video
        assert video.shape[1:] == (SIZE, SIZE, 3) and len(video) >= 2
        assert np.array_equal(video[0], episode[0]) and np.array_equal(video[-1], episode[-1])
        assert all(any(np.array_equal(f, e) for e in episode) for f in video)
        assert PICK_CUBE in " ".join(getattr(p, "text", "") for p in request.chat.user)
    assert not np.array_equal(r["frames"][0][-1], r["frames"][0][0])  # the goal moved onto the cube
    # the fake engine's score: the last frame's brightness, so it is the done step's own frame
    for score, episode in zip(scores, r["frames"], strict=False):
        assert score == pytest.approx(round(episode[-1].mean() / 255 * 100) / 100)


def test_no_server_uses_the_counted_fallback_and_run_a_the_simulators_reward(
    maniskill_python,
    rlinf_trees,
    tmp_path,
):
    lenient = ("--fail-on-request-error", "False", "--fallback", "env_success", "--wait-ready-s", "0")
    r = _drive(
        maniskill_python,
        rlinf_trees,
        tmp_path / "fallback.json",
        *("--url", f"http://127.0.0.1:{free_port()}", "--deadline-s", "2", "--reward-coef", str(COEF), *lenient),
        *("--max-steps", "10", "--steps", "14", "--goal-step", "4"),
    )
    rewards = np.array(r["rewards"])
    expected = np.zeros(14)
    expected[3] = COEF  # env_success: ManiSkill's flag stands in for the score, flagged
    np.testing.assert_allclose(rewards, expected)
    assert [d["episode"]["vlm_fallback"] for d in r["done"]] == [[1.0], [1.0]]
    assert r["counts"]["fallbacks"] == 2 and r["counts"]["request_errors"] == 2
    assert "use the 'env_success' fallback" in r["log"]

    native = _drive(
        maniskill_python,
        rlinf_trees,
        tmp_path / "native.json",
        *("--run", "runA", "--reward", "False", "--max-steps", "10", "--steps", "6", "--goal-step", "4"),
    )
    assert native["patched"] and native["task"] is None and "counts" not in native
    assert all(0 < x <= 1 for x in native["rewards"])  # ManiSkill's normalized dense reward, every step
    assert not [k for k in native["done"][0]["episode"] if k.startswith("vlm_")]
