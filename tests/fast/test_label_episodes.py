"""reward_tools.label_episodes on the fake engine: collected episodes -> judged -> RLinf's reward
datasets and the agreement report.

The episodes are pickles in the exact layout RLinf main's CollectEpisode writes (per-step obs
dicts with torch `main_images`, a leading reset entry, infos with `success` and
`episode.success_once`, torch flags; tests/maniskill/test_reward_model_workflow.py has them written by the
wrapper itself in the simulator's environment), and the earlier form's `.npy` trajectories. The
fake engine scores a frame by its brightness, so an episode whose frames turn bright at the step
the simulator calls success gets a progress curve that rises there.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from reward_protocol.frames import QWEN2_5_VL
from reward_tools import label_episodes
from reward_tools.frame_labels import LabelRule, frame_labels, judge_picks, point_ends
from reward_tools.reward_datasets import SplitOptions, sample_indices, split_by_episode
from tests.helpers.servers import InProcessServer

REPO = Path(__file__).resolve().parents[2]
DARK, BRIGHT = 20, 240
TASKS = ("pick up the red cube", "open the drawer")


def rlinf_episode(steps: int, success_at: int | None, task: str, size: int = 32, numpy: bool = False) -> dict:
    """One episode as CollectEpisode pickles it: observations[0] is the reset observation (its
    info {}), frame s comes after action s; frames are bright from success_at on. ManiSkill's
    frames are torch tensors, LIBERO's numpy arrays (`numpy`)."""
    observations, infos = [], []
    for s in range(steps + 1):
        bright = success_at is not None and s >= success_at
        image = torch.full((size, size, 3), BRIGHT if bright else DARK, dtype=torch.uint8)
        image[0, 0, 0] = s  # every frame distinct, so a test can tell which one the dataset took
        image = image.numpy() if numpy else image
        state = np.zeros(9, np.float32) if numpy else torch.zeros(9)
        observations.append({"main_images": image, "states": state, "task_descriptions": task})
        if s == 0:
            infos.append({})
        else:
            flag = np.bool_ if numpy else torch.tensor
            infos.append({"success": flag(bright), "episode": {"success_once": flag(bright)}})
    return {
        "rank": 0,
        "env_idx": 0,
        "episode_id": 0,
        "step": steps,
        "success": success_at is not None,
        "observations": observations,
        "actions": [np.zeros(7, np.float32) if numpy else torch.zeros(7) for _ in range(steps)],
        "rewards": [0.0] * (steps + 1),
        "terminated": [False] + [s == steps for s in range(1, steps + 1)],
        "truncated": [False] * (steps + 1),
        "infos": infos,
    }


def write_rlinf_episodes(root: Path, plan: list[tuple[int, int | None, str]], numpy: bool = False) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (steps, success_at, task) in enumerate(plan):
        label = "success" if success_at is not None else "fail"
        path = root / f"rank_0_env_{i}_episode_0_step_{steps}_{label}.pkl"
        with open(path, "wb") as f:
            pickle.dump(rlinf_episode(steps, success_at, task, numpy=numpy), f)
        paths.append(path)
    return paths


PLAN = [
    (8, 4, TASKS[0]),
    (8, None, TASKS[0]),
    (12, 6, TASKS[1]),
    (12, None, TASKS[1]),
    (10, 3, TASKS[0]),
    (10, None, TASKS[1]),
]


@pytest.fixture(scope="module")
def server():
    with InProcessServer() as s:
        yield s


def _run(server, episodes: Path, out: Path, *extra: str) -> tuple[int, dict]:
    code = label_episodes.main(
        ["--url", server.url, "--episodes", str(episodes), "--out", str(out), "--batch-size", "4", *extra]
    )
    report = json.loads((out / "agreement.json").read_text()) if (out / "agreement.json").exists() else {}
    return code, report


# --- the rule -----------------------------------------------------------------------------------


def test_the_curve_rule_labels_frames_from_the_first_point_at_the_threshold():
    # 9 frames, 16 asked: the model sees 10 (the last repeated); 5 points end at frames 1 3 5 7 8
    picks = judge_picks(QWEN2_5_VL, 16, 9)
    assert picks == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8]
    ends = point_ends(QWEN2_5_VL, 16, picks, 5)
    assert ends == [1, 3, 5, 7, 8]
    rule = LabelRule(kind="curve", points=5, threshold=0.5)
    labels = frame_labels(rule, 9, 0.9, [0.1, 0.2, 0.6, 0.4, 0.9], ends)
    assert labels.tolist() == [False] * 5 + [True] * 4  # from point 3's last frame; a later dip counts not
    assert not frame_labels(rule, 9, 0.4, [0.1, None, 0.3, 0.4, 0.45], ends).any()
    assert frame_labels(rule, 9, 0.9, [None, 0.7, 0.1, 0.1, 0.1], ends).tolist() == [False] * 3 + [True] * 6


def test_the_score_rule_labels_the_last_frames_of_a_success():
    rule = LabelRule(kind="score", threshold=0.5, last_frames=3)
    assert frame_labels(rule, 6, 0.5, None, None).tolist() == [False] * 3 + [True] * 3
    assert not frame_labels(rule, 6, 0.49, None, None).any()
    assert frame_labels(rule, 2, 0.9, None, None).tolist() == [True, True]
    with pytest.raises(ValueError, match="points >= 2"):
        LabelRule(kind="curve", points=1)


def test_sampling_and_split_follow_rlinf_preprocessing():
    # RLinf's _compute_sample_indices, values worked out by hand from its rule
    assert sample_indices(10, 0, True) == list(range(10))
    assert sample_indices(10, 1, True) == [9]
    assert sample_indices(10, 4, True) == [0, 4, 8, 9]
    assert sample_indices(10, 4, False) == [0, 3, 6, 9]
    assert sample_indices(3, 5, True) == [0, 1, 2]
    episodes = [([f"e{e}f{f}" for f in range(4)], [0, 0, 1, 1] if e % 2 else [0, 0, 0, 0]) for e in range(10)]
    train, val = split_by_episode(episodes, SplitOptions(val_split=0.2, fail_success_ratio=2.0, seed=7))
    assert (train.episodes, val.episodes) == (8, 2)
    train_eps = {img.split("f")[0] for img in train.images}
    assert not train_eps & {img.split("f")[0] for img in val.images}  # no episode in both splits
    for part in (train, val):
        if part.raw_success:
            assert part.labels.count(1) == part.raw_success
            assert part.labels.count(0) == min(part.raw_fail, 2 * part.raw_success)
            for img, lbl in zip(part.images, part.labels, strict=True):
                episode, frame = map(int, img[1:].split("f"))
                assert (episode % 2 == 1 and frame >= 2) == (lbl == 1)
        else:
            assert part.images == []
    again = split_by_episode(episodes, SplitOptions(val_split=0.2, fail_success_ratio=2.0, seed=7))
    assert again[0].images == train.images  # the seed fixes the split and the draws


# --- the tool on the fake engine ----------------------------------------------------------------


def test_labels_rlinf_pickles_into_train_and_val_with_an_agreement_report(server, tmp_path, capsys):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN)
    seen = len(server.engine.seen)
    out = tmp_path / "labeled"
    code, report = _run(server, episodes, out, "--points", "5", "--nframes", "16")
    assert code == 0
    assert json.loads(capsys.readouterr().out) == report  # printed too

    # every episode was judged once as a curve of 5 points, 4 episodes per raw batch request
    assert len(server.engine.seen) - seen == len(PLAN) * 5
    o = report["overall"]
    assert o["episodes"] == 6 and o["judged_success"] == 3
    assert o["episode"]["accuracy"] == 1.0 and o["episode"]["auc"] == 1.0
    assert o["episode"]["true_success"] == 3 and o["episode"]["true_failure"] == 3
    # frames: the judge marks success from the end of the first bright point on, the simulator from
    # the first bright frame, so the frames in between are the only disagreements
    lines = (out / "judged.jsonl").read_text().splitlines()[1:]
    judged = {entry["name"]: entry for entry in map(json.loads, lines)}
    first = judged["rank_0_env_0_episode_0_step_8_success.pkl"]
    assert first["ends"] == [1, 3, 5, 7, 8]
    assert first["curve"][:2] == [pytest.approx(DARK / 255, abs=0.01)] * 2
    assert o["frame"]["false_failure"] > 0 and o["frame"]["false_success"] == 0
    assert set(report["per_task"]) == set(TASKS)
    assert report["per_task"][TASKS[1]]["episodes"] == 3
    assert report["judge"]["backend"] == server.settings.backend and report["judge"]["engine"] == "fake"
    assert report["skipped"] == {"unreadable": [], "not_judged": []}

    train = torch.load(out / "train.pt", weights_only=False)
    val = torch.load(out / "val.pt", weights_only=False)
    assert set(train) == {"images", "labels", "metadata"}
    for part in (train, val):
        assert len(part["images"]) == len(part["labels"])
        for image, label in zip(part["images"], part["labels"], strict=True):
            assert image.dtype == torch.uint8 and image.shape == (32, 32, 3)
            assert isinstance(label, int) and (image[1, 1, 0].item() == BRIGHT) >= (label == 1)
    meta = train["metadata"]
    assert meta["judge"]["engine"] == "fake" and meta["rule"]["kind"] == "curve" and meta["rule"]["points"] == 5
    assert meta["fail_success_ratio"] == 2.0 and meta["random_seed"] == 42
    assert meta["num_train_samples"] == len(train["images"]) and meta["num_val_samples"] == len(val["images"])
    success_frames = sum(train["labels"]) + sum(val["labels"])
    assert success_frames == o["frames_judged_success"]  # every success frame is kept, fails sampled 2:1


def test_a_broken_pickle_is_named_and_left_out(server, tmp_path):
    episodes = tmp_path / "collected"
    paths = write_rlinf_episodes(episodes, PLAN[:4])
    paths[1].write_bytes(paths[1].read_bytes()[:200])  # cut short, as a crash mid-write leaves it
    (episodes / "rank_0_env_9_episode_0_step_1_fail.pkl").write_bytes(pickle.dumps({"observations": []}))
    code, report = _run(server, episodes, tmp_path / "out")
    assert code == 0
    names = {i["name"]: i["reason"] for i in report["skipped"]["unreadable"]}
    assert set(names) == {paths[1].name, "rank_0_env_9_episode_0_step_1_fail.pkl"}
    assert "cannot be unpickled" in names[paths[1].name]
    assert report["overall"]["episodes"] == 3
    meta = torch.load(tmp_path / "out" / "train.pt", weights_only=False)["metadata"]
    assert sorted(meta["skipped"]["unreadable"]) == sorted(names)
    # --strict: the same episodes give no dataset at all
    code, report = _run(server, episodes, tmp_path / "strict", "--strict")
    assert code == 1 and not (tmp_path / "strict" / "train.pt").exists()
    assert len(report["skipped"]["unreadable"]) == 2


def test_an_episode_without_a_score_is_named_and_left_out(tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, [(8, 4, "sort the blocks"), (8, None, TASKS[0]), (8, 2, TASKS[0])])
    with InProcessServer(engine_option=["answer=no idea"]) as s:  # nothing to parse a score from
        code, report = _run(s, episodes, tmp_path / "out", "--rule", "score")
    assert code == 1  # nothing could be labeled
    assert len(report["skipped"]["not_judged"]) == 3
    assert all("no score" in i["reason"] for i in report["skipped"]["not_judged"])


def test_a_resumed_run_judges_only_what_the_journal_lacks(server, tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN)
    out = tmp_path / "out"
    code, first = _run(server, episodes, out, "--rule", "score", "--last-frames", "2")
    assert code == 0
    journal = out / "judged.jsonl"
    lines = journal.read_text().splitlines()
    # a crash in the middle of writing the last batch: 2 whole lines kept, the third cut short
    journal.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])
    seen = len(server.engine.seen)
    code, second = _run(server, episodes, out, "--rule", "score", "--last-frames", "2")
    assert code == 0
    assert len(server.engine.seen) - seen == 4  # the six minus the two kept
    assert second["timing"]["labeled_from_journal"] == 2 and second["timing"]["sent_to_judge"] == 4
    assert second["overall"] == first["overall"]
    # only the rule's threshold changed: no request at all, new labels
    seen = len(server.engine.seen)
    code, third = _run(server, episodes, out, "--rule", "score", "--last-frames", "2", "--threshold", "0.95")
    assert code == 0 and len(server.engine.seen) == seen
    assert third["overall"]["judged_success"] == 0
    # asking the judge differently on the same journal is refused, not mixed in
    with pytest.raises(SystemExit, match="asked the judge differently"):
        _run(server, episodes, out, "--rule", "score", "--nframes", "8")


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def test_ctrl_c_keeps_every_judged_batch(tmp_path):
    """A real process interrupted mid-run (SIGINT) resumes with the batches it had finished."""
    episodes = tmp_path / "collected"
    n = 24  # 12 batches of ~0.5 s: the interrupt, sent once the first is journaled, lands mid-run even
    # when this test's process is slow to look (a CI run saw the child finish 4 batches first)
    # numpy frames (LIBERO's): the child never imports torch, so it starts in a second or two
    write_rlinf_episodes(episodes, [(6, 3 if i % 2 else None, TASKS[i % 2]) for i in range(n)], numpy=True)
    out = tmp_path / "out"
    with InProcessServer(engine_option=["delay_ms=500"]) as s:
        cmd = [sys.executable, "-m", "reward_tools.label_episodes", "--url", s.url, "--episodes", str(episodes)]
        cmd += ["--out", str(out), "--batch-size", "2", "--rule", "score"]
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # as from a shell: SIGINT handled, whatever state the test runner's process is in
            preexec_fn=_interruptible,
        )
        journal = out / "judged.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not journal.exists() or len(journal.read_text().splitlines()) < 3):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        kept = len(journal.read_text().splitlines()) - 1
        assert 2 <= kept < n and "the same command resumes" in err
        seen = len(s.engine.seen)
        code, report = _run(s, episodes, out, "--batch-size", "2", "--rule", "score")
    assert code == 0 and len(s.engine.seen) - seen == n - kept
    assert report["overall"]["episodes"] == n and report["overall"]["episode"]["accuracy"] == 1.0


def test_the_earlier_forms_npy_directories_in_and_out(server, tmp_path):
    episodes = tmp_path / "reward_data"
    for kind, success_at in (("positive", 5), ("negative", None)):
        (episodes / kind).mkdir(parents=True)
        for i in range(2):
            frames = np.full((10, 3, 16, 16), DARK / 255, dtype=np.float32)
            labels = np.zeros(10, dtype=np.float32)
            if success_at is not None:
                frames[success_at:] = BRIGHT / 255
                labels[success_at:] = 1.0
            np.save(episodes / kind / f"{i:06d}.npy", {"images": {"base_camera": frames}, "labels": labels})
    out = tmp_path / "out"
    code, report = _run(server, episodes, out, "--task-text", "pick up the cube", "--points", "4")
    assert code == 0
    assert report["overall"]["episode"]["accuracy"] == 1.0 and report["dataset"]["format"] == "pr301"
    assert report["dataset"]["positive"] == 2 and report["dataset"]["negative"] == 2
    written = np.load(out / "positive" / "000000.npy", allow_pickle=True).item()
    assert set(written) == {"images", "labels"} and written["images"]["base_camera"].shape == (10, 3, 16, 16)
    assert written["labels"].dtype == np.float32 and written["labels"][-1] == 1.0 and written["labels"][0] == 0.0
    # without --task-text these episodes carry no instruction: named, not judged
    code, report = _run(server, episodes, tmp_path / "no_task")
    assert code == 1 and len(report["skipped"]["not_judged"]) == 4
    assert "--task-text" in report["skipped"]["not_judged"][0]["reason"]
    # RLinf main's format from the earlier form's episodes
    code, report = _run(server, episodes, tmp_path / "as_rlinf", "--task-text", "pick", "--format", "rlinf")
    assert code == 0 and (tmp_path / "as_rlinf" / "train.pt").is_file()


# --- a directory the tool does not trust (issue 58, class 7) ------------------------------------


class RunsACommand:
    """Unpickled, runs a shell command (what any pickle can do): here it only leaves a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class TorchStorageRunsACommand:
    """A 'tensor storage' whose bytes are a pickle that runs a command: torch's own
    torch.storage._load_from_bytes loads them with weights_only=False."""

    def __init__(self, marker: Path):
        self.payload = pickle.dumps(RunsACommand(marker), protocol=2)

    def __reduce__(self):
        return (torch.storage._load_from_bytes, (self.payload,))


def test_a_pickle_that_runs_code_is_refused_unrun_and_named(server, tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:2])
    marker = tmp_path / "ran"
    whole = episodes / "rank_0_env_7_episode_0_step_3_fail.pkl"
    whole.write_bytes(pickle.dumps(RunsACommand(marker)))
    nested = rlinf_episode(8, 4, TASKS[0])  # a real episode with the payload in one step's info
    nested["infos"][2]["extra"] = RunsACommand(marker)
    (episodes / "rank_0_env_8_episode_0_step_8_success.pkl").write_bytes(pickle.dumps(nested))
    storage = rlinf_episode(8, 4, TASKS[0])
    storage["observations"][1]["states"] = TorchStorageRunsACommand(marker)
    (episodes / "rank_0_env_9_episode_0_step_8_success.pkl").write_bytes(pickle.dumps(storage))
    code, report = _run(server, episodes, tmp_path / "out")
    assert code == 0 and not marker.exists()  # nothing ran
    refused = {i["name"]: i["reason"] for i in report["skipped"]["unreadable"]}
    assert set(refused) == {whole.name, *(f"rank_0_env_{i}_episode_0_step_8_success.pkl" for i in (8, 9))}
    for reason in refused.values():
        assert "refused" in reason and "--trust-pickles" in reason and "not run" in reason
    assert "posix.system" in refused[whole.name]
    assert report["overall"]["episodes"] == 2  # the two real episodes are labeled as before


def test_trust_pickles_reads_what_the_restricted_reader_refuses(server, tmp_path):
    import datetime

    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:2])
    dated = rlinf_episode(8, 4, TASKS[0])
    dated["collected_on"] = datetime.date(2026, 1, 2)  # harmless, but not numpy, torch or a plain container
    (episodes / "rank_0_env_5_episode_0_step_8_success.pkl").write_bytes(pickle.dumps(dated))
    code, report = _run(server, episodes, tmp_path / "out")
    assert code == 0 and report["overall"]["episodes"] == 2
    (item,) = report["skipped"]["unreadable"]
    assert "datetime.date" in item["reason"]
    code, report = _run(server, episodes, tmp_path / "trusted", "--trust-pickles")
    assert code == 0 and report["overall"]["episodes"] == 3 and report["skipped"]["unreadable"] == []


def test_the_help_says_pickles_run_code():
    text = label_episodes.build_parser().format_help()
    assert "--trust-pickles" in text and "run code" in text


def test_an_npy_that_runs_code_is_refused_unrun(server, tmp_path):
    episodes = tmp_path / "reward_data"
    marker = tmp_path / "ran"
    for kind in ("positive", "negative"):
        (episodes / kind).mkdir(parents=True)
        frames = np.full((6, 3, 16, 16), (BRIGHT if kind == "positive" else DARK) / 255, dtype=np.float32)
        np.save(episodes / kind / "000000.npy", {"images": {"base_camera": frames}, "labels": np.zeros(6, np.float32)})
    np.save(episodes / "negative" / "000001.npy", {"images": {"base_camera": frames}, "x": RunsACommand(marker)})
    code, report = _run(server, episodes, tmp_path / "out", "--task-text", "pick up the cube", "--points", "2")
    assert code == 0 and not marker.exists()
    (item,) = report["skipped"]["unreadable"]
    assert item["name"] == "negative/000001.npy" and "posix.system" in item["reason"]
    assert report["overall"]["episodes"] == 2


def test_a_re_collected_episode_of_the_same_size_is_judged_again(server, tmp_path):
    episodes = tmp_path / "collected"
    _, second = write_rlinf_episodes(episodes, [(8, 4, TASKS[0]), (8, None, TASKS[0])])
    out = tmp_path / "out"
    code, report = _run(server, episodes, out, "--points", "4")
    assert code == 0 and report["overall"]["judged_success"] == 1
    size = second.stat().st_size
    second.write_bytes(pickle.dumps(rlinf_episode(8, 3, TASKS[0])))  # collected again: it succeeds now
    assert second.stat().st_size == size  # same length, same size: only the content says it changed
    seen = len(server.engine.seen)
    code, report = _run(server, episodes, out, "--points", "4")
    assert code == 0 and len(server.engine.seen) - seen == 4  # that episode judged again, the other not
    assert report["timing"]["sent_to_judge"] == 1 and report["timing"]["labeled_from_journal"] == 1
    assert report["overall"]["judged_success"] == 2


def test_one_frame_rule_for_the_whole_episode(server, tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:2], numpy=True)
    floats = rlinf_episode(8, 4, TASKS[0], numpy=True)
    for obs in floats["observations"]:
        obs["main_images"] = obs["main_images"].astype(np.float32) / 255
    floats["observations"][-1]["main_images"][3, 3, 0] = np.float32(1.0000001)  # one pixel a rounding past 1
    (episodes / "rank_0_env_6_episode_0_step_8_success.pkl").write_bytes(pickle.dumps(floats))
    code, report = _run(server, episodes, tmp_path / "out")
    assert code == 0
    (item,) = report["skipped"]["unreadable"]  # refused whole, naming the range: not a near-black last frame
    assert item["name"] == "rank_0_env_6_episode_0_step_8_success.pkl"
    assert "float32" in item["reason"] and "1.0000001" in item["reason"] and "[0, 1]" in item["reason"]


def test_an_episode_the_schema_refuses_is_listed_and_the_run_goes_on(server, tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, [(8, 4, TASKS[0]), (8, None, "x" * 5000), (8, None, TASKS[1])])
    for _ in range(2):  # and again: the same file does not stop a rerun either
        code, report = _run(server, episodes, tmp_path / "out")
        assert code == 0 and report["overall"]["episodes"] == 2
        (item,) = report["skipped"]["not_judged"]
        assert item["name"] == "rank_0_env_1_episode_0_step_8_fail.pkl"
        assert "task_text" in item["reason"] and "4096" in item["reason"]


def _in_thread(target, *args):
    """target(*args) in a thread: (thread, its result or exception, once it ends)."""
    result: dict = {}

    def run():
        try:
            result["value"] = target(*args)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_a_fifo_is_listed_not_read(server, tmp_path):
    """A FIFO named like an episode (its open waits for a writer) and a directory: named, not read."""
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:2], numpy=True)
    fifo = episodes / "rank_0_env_9_episode_0_step_1_fail.pkl"
    os.mkfifo(fifo)
    (episodes / "rank_0_env_8_episode_0_step_1_fail.pkl").mkdir()
    thread, result = _in_thread(_run, server, episodes, tmp_path / "out", "--rule", "score")
    thread.join(30)
    if thread.is_alive():  # stuck in the FIFO's open: a writer that closes at once lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
        pytest.fail("the run waited on the FIFO")
    code, report = result["value"]
    assert code == 0
    reasons = {i["name"]: i["reason"] for i in report["skipped"]["unreadable"]}
    assert "not a regular file (a FIFO)" in reasons["rank_0_env_9_episode_0_step_1_fail.pkl"]
    assert "not a regular file (a directory)" in reasons["rank_0_env_8_episode_0_step_1_fail.pkl"]
    assert report["overall"]["episodes"] == 2


def test_an_unreachable_judge_gives_the_documented_message(tmp_path, caplog):

    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:1], numpy=True)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    argv = ["--url", url, "--episodes", str(episodes), "--out", str(tmp_path / "out"), "--wait-ready-s", "0.5"]
    assert label_episodes.main(argv) == 1
    assert "the judge failed" in caplog.text and "run again to resume" in caplog.text and url in caplog.text


def test_two_runs_on_one_out_do_not_both_write(tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, [(6, 3, TASKS[0])] * 3, numpy=True)
    out = tmp_path / "out"
    with InProcessServer(engine_option=["delay_ms=300"]) as s:
        first, result = _in_thread(_run, s, episodes, out, "--batch-size", "1", "--rule", "score")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (out / "judged.jsonl").exists():
            time.sleep(0.02)
        with pytest.raises(SystemExit, match=r"another label_episodes run \(pid \d+\) is using"):
            _run(s, episodes, out, "--rule", "score")
        first.join(60)
        assert result["value"][0] == 0
        lines = (out / "judged.jsonl").read_text().splitlines()
        assert len(lines) == 1 + 3  # the header and each episode once: the second run wrote nothing
        assert _run(s, episodes, out, "--rule", "score")[0] == 0  # the lock goes with the run that held it


def test_an_episode_the_server_refuses_as_too_large_is_listed_and_the_others_judged(tmp_path):
    episodes = tmp_path / "collected"
    write_rlinf_episodes(episodes, PLAN[:2], numpy=True)
    big = rlinf_episode(8, 4, TASKS[0], size=160, numpy=True)  # its 10 frames: 768 kB, over the server's 200 kB
    (episodes / "rank_0_env_5_episode_0_step_8_success.pkl").write_bytes(pickle.dumps(big))
    with InProcessServer(max_body_mb=0.2) as s:
        code, report = _run(s, episodes, tmp_path / "out", "--rule", "score")
    assert code == 0 and report["overall"]["episodes"] == 2
    (item,) = report["skipped"]["not_judged"]
    assert item["name"] == "rank_0_env_5_episode_0_step_8_success.pkl" and "413" in item["reason"]


def test_image_key_picks_the_camera_of_the_earlier_form(server, tmp_path):
    episodes = tmp_path / "reward_data"
    for kind, value in (("positive", BRIGHT), ("negative", DARK)):
        (episodes / kind).mkdir(parents=True)
        wrist = np.full((6, 3, 16, 16), (255 - value) / 255, dtype=np.float32)  # the other camera: the opposite
        main = np.full((6, 3, 16, 16), value / 255, dtype=np.float32)
        np.save(episodes / kind / "000000.npy", {"images": {"main": main, "wrist": wrist}, "labels": np.zeros(6)})
    argv = ["--task-text", "pick up the cube", "--rule", "score"]
    code, report = _run(server, episodes, tmp_path / "out", *argv, "--image-key", "main")
    assert code == 0 and report["overall"]["episode"]["accuracy"] == 1.0  # the judge saw main, not wrist


def test_the_restricted_reader_gives_what_pickle_gives():
    """Tensors of every dtype RLinf's envs store (views, transposes, 0-d flags, empty), numpy arrays
    and scalars, every pickle protocol: equal to plain pickle's, dtype, shape and strides."""
    import io

    from reward_tools.episode_unpickler import load

    base = torch.arange(24).reshape(4, 6)
    dtypes = (torch.uint8, torch.bool, torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
    tensors = [t.to(d) for d in dtypes for t in (base, base.t(), base[1:, ::2], torch.tensor(1), torch.empty(0))]
    arrays = [np.arange(6).astype(d).reshape(2, 3) for d in (np.uint8, np.float32, np.bool_, np.int64)]
    value = {"t": tensors, "a": arrays, "s": [np.bool_(True), np.float32(0.5), 3, "x", None, (1, 2.0), {1}]}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        got = load(io.BytesIO(pickle.dumps(value, protocol=protocol)))
        for a, b in zip(got["t"], tensors, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
        for a, b in zip(got["a"], arrays, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert got["s"] == value["s"] and type(got["s"][0]) is np.bool_
