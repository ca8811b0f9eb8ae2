"""RLinf main's reward-model workflow with the judge as the labeler, on the real simulator.

RLinf main's own ManiskillEnv (PickCube-v1, CPU physics, SAPIEN on lavapipe) wrapped in its own
CollectEpisode writes the episode pickles (tests/reward_model_driver.py, in the simulator's
environment); reward_tools.label_episodes labels them through the real app on the fake engine in
this process; RLinf's own preprocessing script and the tool's writer give the same datasets from
the same (simulator) labels; RLinf main's RewardBinaryDataset and ResNetRewardModel train on the
tool's train.pt and load the result as `reward.model.model_path` does.

The judge is the fake engine, not the tiny checkpoint: neither knows anything about PickCube (the
tiny checkpoint has random weights), so their labels are equally meaningless; the fake engine
answers in milliseconds and deterministically (a frame's brightness), which keeps this test to
the plumbing it checks: the real pickles read, every episode judged once in raw batches, the
rule applied, the datasets RLinf reads. The threshold is set from the judge's own answers (their
median, re-labeled from the journal without asking again) so both classes are present.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
from pathlib import Path

import pytest
import torch

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
        maniskill_python, rlinf_main, "collect", work / "collect.json", "--save-dir", str(save),
        "--episodes-count", str(EPISODES), "--max-steps", str(MAX_STEPS),
    )
    return save, result


def test_judge_labels_rlinf_mains_collected_episodes_and_rlinfs_classifier_trains_on_them(
    collected, maniskill_python, rlinf_main, tmp_path
):
    save, result = collected
    # RLinf's wrapper wrote one pickle per episode, named by the simulator's verdict
    assert [e["success"] for e in result["episodes"]] == [True, False] * (EPISODES // 2)
    files = sorted(result["files"])
    pattern = r"rank_0_env_0_episode_\d+_step_\d+_(success|fail)\.pkl"
    assert len(files) == EPISODES and all(re.fullmatch(pattern, f) for f in files)
    assert sum(f.endswith("_success.pkl") for f in files) == EPISODES // 2

    out = tmp_path / "labeled"
    with InProcessServer() as server:
        argv = ["--url", server.url, "--episodes", str(save), "--out", str(out), "--task-text", PICK_CUBE]
        argv += ["--points", "4", "--nframes", "8", "--batch-size", "3", "--val-split", "0.5"]
        assert label_episodes.main(argv) == 0
        seen = len(server.engine.seen)
        assert seen == EPISODES * 4  # every episode once, 4 points each
        journal = [json.loads(line) for line in (out / "judged.jsonl").read_text().splitlines()[1:]]
        threshold = statistics.median(v for entry in journal for v in entry["curve"])
        assert label_episodes.main([*argv, "--threshold", f"{threshold:.6f}"]) == 0
        assert len(server.engine.seen) == seen  # re-labeled from the journal, no new request
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

    # RLinf main's dataset class reads the tool's files; its ResNet classifier trains and reloads
    trained = _drive(
        maniskill_python, rlinf_main, "train", tmp_path / "train.json",
        "--data", str(out), "--episodes", str(save), "--steps", "3", "--batch", "8",
    )
    assert trained["train_samples"] == len(torch.load(out / "train.pt", weights_only=False)["images"])
    assert len(trained["losses"]) == 3 and all(loss == loss and loss > 0 for loss in trained["losses"])
    rewards = [r for kind in ("success", "fail") for episode in trained["rewards"][kind] for r in episode]
    assert len(trained["rewards"]["success"]) == EPISODES // 2 and all(0.0 <= r <= 1.0 for r in rewards)
