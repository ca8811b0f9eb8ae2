"""RLinf v0.3 integration: the patched LiberoEnv end to end (the patch and the run configs:
tests/fast/test_rlinf_patch.py).

The LiberoEnv runs in the simulator's own Python environment (scripts/setup_libero_env.sh;
it pins numpy<2) and talks to a real reward server (vllm engine, tiny checkpoint) over HTTP,
as in a real run. RLinf's v0.3 source is the rlinf==0.3.0 wheel; its config groups come from
the reference copy next to this repository (shared/rlinf_v0.3).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.episodes import audit_by_hand
from tests.helpers.rlinf import LIBERO_VENV, REPO, RUN_D
from tests.helpers.servers import InProcessServer, requests_served

DRIVER = REPO / "tests" / "libero_driver.py"


# --- the patched LiberoEnv in the simulator's environment ---------------------------------------


@pytest.fixture(scope="session")
def libero_python() -> str:
    python = LIBERO_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"no LIBERO simulator environment at {LIBERO_VENV}: run `bash scripts/setup_libero_env.sh` "
            "(the README's test command does), or deselect with -m 'not libero'"
        )
    return str(python)


def _driver_env() -> dict:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "MUJOCO_EGL_DEVICE_ID")},
        "LIBERO_CONFIG_PATH": str(LIBERO_VENV / "libero_config"),
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
        "MUJOCO_GL": "egl",
        "PYOPENGL_PLATFORM": "egl",
        "PYTHONPATH": str(REPO),
    }


def _driver(libero_python: str, scenario: str, tree: Path, config: Path, out: Path, *flags: str) -> dict:
    env = _driver_env()
    cmd = [
        libero_python,
        str(DRIVER),
        scenario,
        "--rlinf-dir",
        str(tree),
        "--config-dir",
        str(config),
        "--out",
        str(out),
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    result["log"] = proc.stderr
    return result


@pytest.mark.engine
def test_real_simulator_episodes_are_judged_once_with_their_own_frames(
    libero_python, rlinf_trees, vllm_server, video_dir, tmp_path
):
    episodes_dir = video_dir / "libero"
    episodes_dir.mkdir(exist_ok=True)
    out = tmp_path / "sim.json"
    r = _driver(
        libero_python,
        "sim",
        rlinf_trees["patched"],
        rlinf_trees["config"],
        out,
        "--url",
        vllm_server.url,
        "--video-dir",
        str(episodes_dir),
        "--max-steps",
        "24",
        "--goal-chunk",
        "2",
        "--score-mode",
        "logprob",  # random weights write no parsable number; P(yes) is always a score
    )
    rewards, terms, truncs = (np.array(r[k]) for k in ("rewards", "terminations", "truncations"))
    coef, scores = r["reward_coef"], np.array(r["episode"]["vlm_score"])
    assert r["patched"] and r["counts"]["episodes"] == 2 and r["counts"]["fallbacks"] == 0
    assert np.all((scores >= 0) & (scores <= 1))

    # env 0 reached the goal state: judged at its first done step, and only there
    first_done = int(np.flatnonzero(terms[0])[0])
    assert 8 <= first_done <= 11, terms[0]
    assert rewards[0, first_done] == pytest.approx(coef * scores[0])
    assert np.count_nonzero(rewards[0]) <= 1 and rewards[0].sum() == pytest.approx(coef * scores[0])
    # env 1 never succeeded: judged when truncated at the last step
    assert not terms[1].any() and truncs[1, -1]
    assert rewards[1, -1] == pytest.approx(coef * scores[1]) and rewards[1].sum() == pytest.approx(coef * scores[1])
    assert r["episode"]["success_once"] == [True, False]  # ground truth stays RLinf's
    assert np.array(r["episode"]["vlm_fallback"]).tolist() == [0.0, 0.0]

    # what the server read are the env's frames: count, shape, order, and they change
    env_frames = np.load(str(out) + ".frames.npy")  # [env, step, 256, 256, 3]
    videos = sorted(episodes_dir.glob("*_env*.mp4"), key=lambda p: p.name.endswith("env1.mp4"))
    assert [p.name[-8:] for p in videos] == ["env0.mp4", "env1.mp4"]
    for env_id, path in enumerate(videos):
        sent = _all_frames(path)
        steps = r["sent_steps"][env_id]
        assert sent.shape == (len(steps), 256, 256, 3)
        assert steps[0] == 0 and len(steps) == min(16, steps[-1] + 1)
        expected = env_frames[env_id, steps]
        assert np.abs(sent.astype(int) - expected.astype(int)).mean() < 6  # H.264, nothing else
        assert np.abs(sent[0].astype(int) - sent[-1].astype(int)).mean() > 1  # the scene changed
    assert r["sent_steps"][0][-1] == first_done + 1  # env 0's video ends at its success frame


def test_real_simulator_views_reach_the_judge_as_named_clips(libero_python, rlinf_trees, tmp_path):
    # reward_model.views [main_images, wrist_images] on the patched LiberoEnv: each episode is one
    # request of two clips, the agent view's and the wrist camera's, at the same steps
    with InProcessServer() as server:
        r = _driver(
            libero_python,
            "sim",
            rlinf_trees["patched"],
            rlinf_trees["config"],
            tmp_path / "views.json",
            *("--url", server.url, "--max-steps", "16", "--goal-chunk", "1", "--views", "main_images", "wrist_images"),
        )
        seen = list(server.engine.seen)
    assert r["counts"]["episodes"] == 2 and r["counts"]["fallbacks"] == 0 and len(seen) == 2
    env_frames = np.load(str(tmp_path / "views.json") + ".frames.npy")  # the main camera [env, step, H, W, 3]
    for request in seen:
        main, wrist = request.videos()
        assert [t for t in request.chat.texts() if t.endswith(":")] == ["main camera:", "wrist camera:"]
        assert main.shape == wrist.shape and main.shape[0] >= 2
        assert np.abs(main.astype(int) - wrist.astype(int)).mean() > 10  # two cameras, not one twice
    # the main clip is the env's agent view: its last frame is the episode's last main frame, resized
    steps = r["sent_steps"][0]
    main_last = [q.videos()[0][-1] for q in seen]
    assert any(np.abs(m.astype(int).mean() - env_frames[0, steps[-1]].mean()) < 3 for m in main_last)


def test_reward_model_off_gives_rlinfs_original_rewards(libero_python, rlinf_trees, tmp_path):
    common = ("--max-steps", "16", "--goal-chunk", "1", "--reward", "False")
    off = _driver(libero_python, "sim", rlinf_trees["patched"], rlinf_trees["config"], tmp_path / "off.json", *common)
    orig = _driver(
        libero_python, "sim", rlinf_trees["original"], rlinf_trees["config"], tmp_path / "orig.json", *common
    )
    assert off["patched"] and not orig["patched"]
    assert off["rewards"] == orig["rewards"]
    assert np.array(off["rewards"]).max() == pytest.approx(off["reward_coef"])  # the success bonus, once
    assert off["terminations"] == orig["terminations"]


@pytest.mark.engine
def test_64_envs_ending_together_make_one_batch_request(libero_python, rlinf_trees, vllm_server, tmp_path):
    batch_before, single_before = requests_served(vllm_server, "/score/batch"), requests_served(vllm_server, "/score")
    r = _driver(
        libero_python,
        "many",
        rlinf_trees["patched"],
        rlinf_trees["config"],
        tmp_path / "many.json",
        "--url",
        vllm_server.url,
        "--max-steps",
        "3",
        "--score-mode",
        "logprob",
    )
    assert r["error"] is None
    assert r["counts"]["batches"] == 1 and r["counts"]["episodes"] == 64 and r["client_attempts"] == 1
    # the run config's canary_fraction 0.1: 6 of the 64 episodes probed three ways, in that same request
    assert r["counts"]["canaries"] == 18 and r["counts"]["canary_failures"] == 0
    assert requests_served(vllm_server, "/score/batch") - batch_before == 1
    assert requests_served(vllm_server, "/score") == single_before
    rewards, scores = np.array(r["rewards"]), np.array(r["episode"]["vlm_score"])
    assert np.allclose(rewards[:, -1], r["reward_coef"] * scores) and not rewards[:, :-1].any()


def _with_dead_server(libero_python: str, rlinf_trees: dict, out: Path, *flags: str) -> dict:
    """The 64-env stand-in rollout against a port where no reward server listens."""
    dead = ("--url", "http://127.0.0.1:9", "--max-steps", "2", "--wait-ready-s", "0", "--deadline-s", "2")
    return _driver(libero_python, "many", rlinf_trees["patched"], rlinf_trees["config"], out, *dead, *flags)


def test_unreachable_server_fails_fast_when_asked(libero_python, rlinf_trees, tmp_path):
    r = _with_dead_server(libero_python, rlinf_trees, tmp_path / "dead.json")
    assert r["error"] and "VLM reward request for 64 episodes failed" in r["error"]
    assert "fail_on_request_error: False" in r["error"]


def test_unreachable_server_falls_back_counted_and_logged(libero_python, rlinf_trees, tmp_path):
    fallback = ("--fail-on-request-error", "False", "--fallback", "env_success")
    r = _with_dead_server(libero_python, rlinf_trees, tmp_path / "fallback.json", *fallback)
    assert r["error"] is None
    assert r["counts"]["fallbacks"] == 64 and r["counts"]["request_errors"] == 1
    assert r["episode"]["vlm_fallback"] == [1.0] * 64
    expected = [r["reward_coef"] * (i in r["succeeded"]) for i in range(64)]
    assert np.array(r["rewards"])[:, -1].tolist() == expected  # env_success: the 0/1 signal, flagged
    assert "use the 'env_success' fallback" in r["log"]


@pytest.mark.engine
@pytest.mark.parametrize("fail_fast", [True, False], ids=["fail_fast", "fallback"])
def test_server_killed_during_a_rollout(libero_python, rlinf_trees, tiny_checkpoint, tmp_path, fail_fast):
    from reward_tools.launch import ServerProcess
    from tests.helpers.servers import CPU_PRESET

    server = ServerProcess(
        ["--config", str(CPU_PRESET), "--engine", "hf", "--model-path", tiny_checkpoint],
        log_path=tmp_path / "server.log",
    )
    server.start()
    server.wait_ready(300)
    ready, out = tmp_path / "ready", tmp_path / "killed.json"
    env = _driver_env()
    cmd = [
        libero_python,
        str(DRIVER),
        "many",
        "--rlinf-dir",
        str(rlinf_trees["patched"]),
        "--config-dir",
        str(rlinf_trees["config"]),
        "--out",
        str(out),
        "--url",
        server.url,
        "--max-steps",
        "4",
        "--step-sleep",
        "1",
        "--ready-file",
        str(ready),
        "--deadline-s",
        "3",
        "--fail-on-request-error",
        str(fail_fast),
        "--fallback",
        "zero",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "driver not ready"
        server.stop()  # the reward server dies in the middle of the rollout
        _, stderr = proc.communicate(timeout=300)
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    r = json.loads(out.read_text())
    if fail_fast:
        assert r["error"] and "VLM reward request for 64 episodes failed" in r["error"]
    else:
        assert r["error"] is None and r["counts"]["fallbacks"] == 64
        assert r["episode"]["vlm_fallback"] == [1.0] * 64
        assert "64 episodes use the 'zero' fallback" in stderr


# --- the live audit and the canaries on the real simulator --------------------------------------

OTHER_TASK = "put both the cream cheese box and the butter in the basket"  # LIBERO-10 task 1


def _audit_run(libero_python: str, rlinf_trees: dict, server, out: Path, *flags: str) -> dict:
    common = ("--url", server.url, "--max-steps", "16", "--goal-chunk", "2", "--score-mode", "logprob", "--envs", "3")
    r = _driver(libero_python, "audit", rlinf_trees["patched"], rlinf_trees["config"], out, *common, *flags)
    r["frames"] = np.load(str(out) + ".frames.npy")  # [epoch, env, step, H, W, 3]
    r["sent"] = np.load(str(out) + ".wire.npz")
    return r


@pytest.mark.engine
def test_live_audit_and_canaries_on_the_real_simulator(libero_python, rlinf_trees, hf_server, tmp_path):
    on = _audit_run(
        libero_python,
        rlinf_trees,
        hf_server,
        tmp_path / "on.json",
        *("--epochs", "2", "--audit", "True", "--canary-fraction", "1.0", "--canary-tasks", OTHER_TASK),
    )
    coef, thr = on["reward_coef"], on["threshold"]
    assert on["counts"]["episodes"] == 6 and on["counts"]["canaries"] == 18 and on["counts"]["canary_failures"] == 0
    expected_logged: dict[str, list[float]] = {}
    for k, epoch in enumerate(on["epochs"]):
        episode = epoch["episode"]
        labels = episode["success_once"]
        assert labels == [e == k for e in range(3)]  # env k succeeded in epoch k, the others failed
        items = [i for b in on["wire"] if b["epoch"] == k for i in b["items"]]
        real = {}
        for item in items:  # what travelled: real episodes unmarked, probes marked, and their exact frames
            if item["request_id"] is None:
                (env,) = [e for e in range(3) if _holds(on, k, e, item)]  # the env whose frames these are
                real[env] = item["score"]
                assert item["task"] == epoch["task_descriptions"][env]
                continue
            _, kind, env = item["request_id"].split("-")
            steps = epoch["sent_steps"][int(env)]
            episode_frames, sent = on["frames"][k, int(env), steps], on["sent"][item["frames"]]
            if kind == "static":
                assert np.array_equal(sent, np.repeat(episode_frames[:1], len(steps), axis=0))
            elif kind == "reversed":
                assert np.array_equal(sent, episode_frames[::-1])
            else:
                assert kind == "wrong_task" and item["task"] == OTHER_TASK and np.array_equal(sent, episode_frames)
        assert sorted(real) == [0, 1, 2]
        scores = [real[e] for e in range(3)]
        # the reward is the real episode's score, whatever its probes scored
        rewards = np.array(epoch["rewards"])
        assert rewards.sum(axis=1) == pytest.approx([coef * s for s in scores], rel=1e-6)
        assert episode["vlm_score"] == pytest.approx(scores, rel=1e-6)

        hand = audit_by_hand(scores, labels, thr)
        probes = {
            kind: [i["score"] for i in items if (i["request_id"] or "").startswith(f"canary-{kind}-")]
            for kind in ("static", "reversed", "wrong_task")
        }
        hand_canary = {f"vlm_canary/{kind}": float(np.mean(v)) for kind, v in probes.items()}
        hand_canary["vlm_canary/real_success"] = hand["score_success"]
        hand_canary["vlm_canary/real_failure"] = hand["score_failure"]
        expected = {f"vlm_audit/{name}": v for name, v in hand.items()}
        expected |= {f"vlm_audit/task0/{name}": v for name, v in hand.items()}  # all three envs run task 0
        expected |= hand_canary | {"vlm_canary/failed": 0.0}
        for key, value in expected.items():
            assert episode[key] == pytest.approx([value] * 3, rel=1e-6, abs=1e-7), key
            expected_logged.setdefault(key, []).append(value)
        assert {k for k in episode if k.startswith(("vlm_audit", "vlm_canary"))} == set(expected)
    # RLinf's own reduction of what it read at the end of each epoch: the mean of the epochs' values
    for key, values in expected_logged.items():
        assert on["logged"][key] == pytest.approx(float(np.mean(values)), rel=1e-6, abs=1e-7), key

    # the same first epoch with the audit off: the same requests travel, the same rewards come back
    flags = ("--epochs", "1", "--audit", "False", "--canary-fraction", "1.0", "--canary-tasks", OTHER_TASK)
    off = _audit_run(libero_python, rlinf_trees, hf_server, tmp_path / "off.json", *flags)
    assert not any(k.startswith("vlm_audit") for k in off["epochs"][0]["episode"])
    # alike to the float's last bits: the transformers engine batches the requests that arrive
    # together, and a busy machine changes which do (one reward moved by 1e-7 with a second test
    # running beside this one); a request the audit had changed would move it by far more
    assert off["epochs"][0]["rewards"] == [pytest.approx(r, rel=1e-6, abs=1e-7) for r in on["epochs"][0]["rewards"]]


def _holds(run: dict, epoch: int, env: int, item: dict) -> bool:
    """Whether a sent item's frames are exactly env's episode frames of that epoch."""
    steps = run["epochs"][epoch]["sent_steps"][env]
    sent = run["sent"][item["frames"]]
    return sent.shape[0] == len(steps) and np.array_equal(sent, run["frames"][epoch, env, steps])


def _all_frames(path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


@pytest.mark.engine
def test_dense_rewards_reach_rlinfs_rollout_buffer_at_their_steps(libero_python, rlinf_trees, vllm_server, tmp_path):
    """Run D's env on the real simulator, stepped as RLinf's env worker steps it (its rollout
    buffer, the patched place_vlm_rewards after every chunk step): the rewards of the trajectory
    that goes to the actor are each curve point's gain x reward_coef at the step where its prefix
    ends, and sum to reward_coef x score; what the env logged as its return is reward_coef x score.
    The same with asynchronous judging: the env emits nothing for the judge while the rollout
    goes on, and the same rewards reach the buffer and the same return the log."""
    from reward_client.rlinf.dense import point_frames
    from reward_protocol.frames import QWEN2_5_VL

    steps = 24
    runs = {}
    for mode in ("sync", "async"):
        r = runs[mode] = _driver(
            libero_python,
            "dense",
            rlinf_trees["patched"],
            rlinf_trees["config"],
            tmp_path / f"dense_{mode}.json",
            "--run",
            RUN_D,
            "--url",
            vllm_server.url,
            "--max-steps",
            str(steps),
            "--goal-chunk",
            "2",
            *(["--async-judge"] if mode == "async" else []),
        )
        coef, trained, emitted = r["reward_coef"], np.array(r["trained"]), np.array(r["emitted"])
        scores, returns = np.array(r["episode"]["vlm_score"]), np.array(r["episode"]["return"])
        assert trained.shape == emitted.shape == (2, steps) and r["counts"]["fallbacks"] == 0
        assert r["episode"]["success_once"] == [True, False]  # env 0 reached the goal, env 1 truncated
        for env in (0, 1):
            curve = r["curves"][env]
            sent = r["sent_steps"][env]
            assert len(curve) == min(8, len(sent) + len(sent) % 2) and curve[-1] == pytest.approx(scores[env])
            done = sent[-1] - 1  # the action whose frame ended the episode
            # the env's own reward: today's terminal reward, once (async: none, the buffer gets it)
            if mode == "sync":
                assert np.flatnonzero(emitted[env]).tolist() == [done]
                assert emitted[env, done] == pytest.approx(coef * scores[env])
            else:
                assert np.count_nonzero(emitted[env]) == 0
            assert returns[env] == pytest.approx(coef * scores[env])  # what RLinf logs as env/return
            # what the actor trains on: each point's gain where its prefix's last frame was made
            expected, previous = np.zeros(steps), 0.0
            for frame, value in zip(point_frames(sent, r["nframes"], len(curve), QWEN2_5_VL), curve, strict=True):
                expected[max(frame - 1, 0)] += coef * (value - previous)
                previous = value
            np.testing.assert_allclose(trained[env], expected, atol=1e-5)
            assert trained[env].sum() == pytest.approx(coef * scores[env], abs=1e-5)
            assert np.count_nonzero(trained[env][:done]) >= 3  # earlier steps got their share
            moved = r["episode"]["vlm_moved_reward"][env]
            assert moved == pytest.approx(coef * scores[env] - trained[env, done], abs=1e-5)
        assert r["placed"] > 0
    # the same episodes (same simulator, same frames sent): the same rewards either way
    assert runs["async"]["sent_steps"] == runs["sync"]["sent_steps"]
    np.testing.assert_allclose(runs["async"]["trained"], runs["sync"]["trained"], atol=1e-3)
