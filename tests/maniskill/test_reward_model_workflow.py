"""RLinf main's reward-model workflow with the judge as the labeler, on the real simulator.

RLinf main's own ManiskillEnv (PickCube-v1, CPU physics, SAPIEN on lavapipe) wrapped in its own
CollectEpisode writes the episode pickles (tests/reward_model_driver.py, in the simulator's
environment); reward_tools.label_episodes labels them through the real app on the fake engine in
this process; RLinf's own preprocessing script and the tool's writer give the same datasets from
the same (simulator) labels. Then RLinf's own trainer
(examples/reward/train_reward_model.py: FSDPRewardWorker + SFTRunner under Ray) trains the
classifier on those files and PPO (maniskill_ppo_mlp_resnet_reward.yaml, `model_type: resnet`,
terminal mode) runs two epochs on its checkpoint, both at toy size on the CPU with the test-only
CPU shim (tests/rlinf_cpu_shim_main.patch); TensorBoard shows the classifier's reward.

The judge is the fake engine, not the tiny checkpoint: neither knows anything about PickCube (the
tiny checkpoint has random weights), so their labels are equally meaningless; the fake engine
answers in milliseconds and deterministically (a frame's brightness), which keeps this test to
the plumbing it checks: the real pickles read, every episode judged once in raw batches, the
rule applied, the datasets RLinf reads. The threshold is set from the judge's own answers (their
median, re-labeled from the journal without asking again) so both classes are present.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

import pytest

from reward_tools import label_episodes
from tests.helpers.rlinf import simulator_env
from tests.helpers.servers import InProcessServer

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "reward_model_driver.py"
PICK_CUBE = "Pick up the red cube and place it on the green spot on the table."
EPISODES = 4
MAX_STEPS = 10


def _drive(python: str, rlinf_dir: Path, command: str, out: Path, *flags: str) -> dict:
    cmd = [python, str(DRIVER), command, "--rlinf-dir", str(rlinf_dir), "--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=simulator_env(), timeout=900)
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def collected(maniskill_python, rlinf_main, tmp_path_factory) -> tuple[Path, dict]:
    work = tmp_path_factory.mktemp("reward_model")
    save = work / "collected"
    result = _drive(
        maniskill_python,
        rlinf_main,
        "collect",
        work / "collect.json",
        "--save-dir",
        str(save),
        "--episodes-count",
        str(EPISODES),
        "--max-steps",
        str(MAX_STEPS),
    )
    return save, result


@pytest.fixture(scope="module")
def labeled(collected, tmp_path_factory) -> tuple[Path, list[dict], list[int]]:
    """The collected episodes labeled on the fake engine: (out dir, journal entries, engine
    requests after the first run and after the re-labeling one)."""
    save, _ = collected
    out = tmp_path_factory.mktemp("labeled")
    with InProcessServer() as server:
        argv = ["--url", server.url, "--episodes", str(save), "--out", str(out), "--task-text", PICK_CUBE]
        argv += ["--points", "4", "--nframes", "8", "--batch-size", "3", "--val-split", "0.5"]
        assert label_episodes.main(argv) == 0
        seen = [len(server.engine.seen)]
        journal = [json.loads(line) for line in (out / "judged.jsonl").read_text().splitlines()[1:]]
        threshold = statistics.median(v for entry in journal for v in entry["curve"])
        assert label_episodes.main([*argv, "--threshold", f"{threshold:.6f}"]) == 0
        seen.append(len(server.engine.seen))
    return out, journal, seen


def test_judge_labels_rlinf_mains_collected_episodes_into_the_datasets_rlinfs_preprocessing_writes(
    collected, labeled, maniskill_python, rlinf_main, tmp_path
):
    save, result = collected
    # RLinf's wrapper wrote one pickle per episode, named by the simulator's verdict
    assert [e["success"] for e in result["episodes"]] == [True, False] * (EPISODES // 2)
    files = sorted(result["files"])
    pattern = r"rank_0_env_0_episode_\d+_step_\d+_(success|fail)\.pkl"
    assert len(files) == EPISODES and all(re.fullmatch(pattern, f) for f in files)
    assert sum(f.endswith("_success.pkl") for f in files) == EPISODES // 2

    out, journal, seen = labeled
    assert seen[0] == EPISODES * 4  # every episode once, 4 points each
    assert seen[1] == seen[0]  # re-labeled at the new threshold from the journal, no new request
    report = json.loads((out / "agreement.json").read_text())
    overall = report["overall"]
    assert overall["episodes"] == EPISODES and overall["compared_episodes"] == EPISODES
    assert 0 < overall["frames_judged_success"] < overall["frames"]
    assert overall["frame"]["accuracy"] is not None and report["skipped"] == {"unreadable": [], "not_judged": []}
    # the frames of each episode are RLinf's: the reset observation and one per step
    assert {entry["frames"] for entry in journal} <= set(range(2, MAX_STEPS + 2))

    # RLinf's own preprocessing and the tool's writer: the same datasets from the same labels
    (tmp_path / "compare").mkdir()
    compared = _drive(
        maniskill_python, rlinf_main, "compare", tmp_path / "compare" / "compare.json", "--episodes", str(save)
    )
    for options, splits in compared.items():
        for split, same in splits.items():
            assert same["labels_equal"] and same["images_equal"], (options, split, same)
    assert sum(s["count"] for s in compared["samples_0_seed_42"].values()) > 0


# --- RLinf's own trainer and PPO on the classifier (RLinf main on CPU: the test-only shim) ------

SHIM = REPO / "tests" / "rlinf_cpu_shim_main.patch"
TRAIN_OVERRIDES = [
    "data.num_workers=0",
    "runner.max_epochs=1",
    "runner.max_steps=3",
    "runner.val_check_interval=3",
    "runner.save_interval=3",
    "actor.model.pretrained=False",
    "actor.model.image_size=[3,64,64]",
    "actor.micro_batch_size=4",
    "actor.global_batch_size=4",
    "actor.optim.lr_warmup_steps=0",
    "~cluster.component_placement",
    "+cluster.component_placement.actor=0",
]
# maniskill_ppo_mlp_resnet_reward.yaml at toy size on the CPU (one env: ManiSkill's CPU physics runs
# one per env object; SAPIEN on lavapipe; RLinf's bucket weight syncer, the one that runs on CPU);
# a rollout epoch's steps must be a multiple of the actor's batch (16)
PPO_STEPS = 16
PPO_EPOCHS = 1  # one rollout and training step (a tiny run's second: ~25 s, docs/bench/cpu_suite_2026-12-07_ci_time)
PPO_OVERRIDES = (
    [
        "~cluster.component_placement",
        "+cluster.component_placement.actor=0",
        "+cluster.component_placement.env=0",
        "+cluster.component_placement.rollout=0",
        "+cluster.component_placement.reward=0",
        "algorithm.update_epoch=1",
        "actor.micro_batch_size=16",
        "actor.global_batch_size=16",
        f"runner.max_epochs={PPO_EPOCHS}",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "weight_syncer.type=bucket",
        "+weight_syncer.bucket.bucket_size=536870912",
        "+weight_syncer.bucket.load_instant=true",
        "env.eval.video_cfg.save_video=False",
        "reward.model.image_size=[3,64,64]",
    ]
    + [
        f"env.{split}.{key}"
        for split in ("train", "eval")
        for key in (
            "total_num_envs=1",
            f"max_episode_steps={PPO_STEPS}",
            f"max_steps_per_rollout_epoch={PPO_STEPS}",
            "init_params.sensor_configs.width=64",
            "init_params.sensor_configs.height=64",
            "init_params.sim_backend=cpu",
        )
    ]
    + ["+env.train.init_params.render_backend=cpu", "+env.eval.init_params.render_backend=cpu"]
)


@pytest.fixture(scope="module")
def rlinf_main_cpu(rlinf_main, tmp_path_factory) -> Path:
    """A copy of the RLinf main checkout with the test-only CPU shim applied."""
    tree = tmp_path_factory.mktemp("rlinf_main_cpu") / "rlinf"
    shutil.copytree(rlinf_main, tree, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    proc = subprocess.run(["patch", "-p1", "-s", "-i", str(SHIM)], cwd=tree, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tree


def _rlinf(python: str, tree: Path, where: str, script: str, log: Path, *overrides: str) -> None:
    env = {**simulator_env(), "PYTHONPATH": f"{tree}{os.pathsep}{REPO}", "CUDA_VISIBLE_DEVICES": ""}
    env.update(EMBODIED_PATH=str(tree / "examples" / "embodiment"), TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    # its own Ray: RLinf's ray.init(address="auto") joins any Ray running on the host (Ray's legacy
    # "auto": one another test started, and stopped under it, hung this run); "local" starts a new one
    env.update(RAY_ADDRESS="local", RAY_TMPDIR=tempfile.mkdtemp(prefix="rm-ray."))
    proc = subprocess.run(
        [python, script, *overrides],
        cwd=tree / "examples" / where,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    log.write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _scalars(logdir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[str, list[float]] = {}
    for events in sorted(logdir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            values.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return values


def test_rlinfs_own_trainer_learns_from_the_judges_labels_and_ppo_runs_on_the_classifier(
    labeled, maniskill_python, rlinf_main_cpu, tmp_path
):
    out, _, _ = labeled
    train_log = tmp_path / "reward_training"
    _rlinf(
        maniskill_python,
        rlinf_main_cpu,
        "reward",
        "train_reward_model.py",
        tmp_path / "train.log",
        f"data.train_data_paths={out / 'train.pt'}",
        f"data.val_data_paths={out / 'val.pt'}",
        f"runner.logger.log_path={train_log}",
        *TRAIN_OVERRIDES,
    )
    weights = sorted(train_log.rglob("model_state_dict/full_weights.pt"))
    assert weights, "RLinf's trainer saved no full_weights.pt"
    trained = _scalars(train_log / "tensorboard")
    assert len(trained["train/loss"]) == 3 and "eval/val_accuracy" in trained

    ppo_log = tmp_path / "ppo"
    _rlinf(
        maniskill_python,
        rlinf_main_cpu,
        "embodiment",
        "train_embodied_agent.py",
        tmp_path / "ppo.log",
        "--config-path",
        str(rlinf_main_cpu / "examples" / "embodiment" / "config"),
        "--config-name",
        "maniskill_ppo_mlp_resnet_reward",
        f"runner.logger.log_path={ppo_log}",
        f"reward.model.model_path={weights[-1]}",
        *PPO_OVERRIDES,
    )
    scalars = _scalars(ppo_log / "tensorboard")
    # the classifier's reward (its sigmoid, at each episode's end: terminal mode), one value per epoch
    rewards = scalars.get("env/reward_model_output", [])
    assert len(rewards) == PPO_EPOCHS and all(0.0 < r < 1.0 for r in rewards), sorted(scalars)
    assert len(scalars["train/actor/approx_kl"]) == PPO_EPOCHS  # the actor trained on those rewards, each epoch
