"""The live audit's and the canaries' arithmetic against values worked out by hand (no server)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from reward_client import judge_metrics as m
from reward_client.rlinf.audit import CanaryTally, JudgeAudit, task_key
from reward_client.rlinf.canary import (
    CanaryPlanner,
    CanarySelector,
    make_probes,
    other_task,
    reversed_frames,
    static_frames,
)

SCORES = [0.9, 0.6, 0.4, 0.5, 0.2]
LABELS = [1, 1, 1, 0, 0]


def test_error_rates_by_hand():
    # at 0.5: predicted success 0.9, 0.6, 0.5 -> FP 1 of 2 failures, FN 1 (0.4) of 3 successes
    assert m.error_rates(SCORES, LABELS, 0.5) == pytest.approx((1 / 2, 1 / 3))
    assert m.error_rates(SCORES, LABELS, 0.95) == pytest.approx((0.0, 1.0))
    assert m.error_rates([0.7, 0.8], [1, 1], 0.5) == (None, 0.0)  # no failures: no false-positive rate
    assert m.error_rates([0.7], [0], 0.5) == (1.0, None)


def test_summary_by_hand():
    s = m.summarize_judge(SCORES, LABELS, 0.5)
    assert (s.episodes, s.successes) == (5, 3)
    assert s.auroc == pytest.approx(5 / 6)
    assert (s.fpr, s.fnr) == pytest.approx((1 / 2, 1 / 3))
    assert s.score_success == pytest.approx((0.9 + 0.6 + 0.4) / 3) and s.score_failure == pytest.approx(0.35)
    # bins of 0.1: 0.2 (fail) | 0.4 (succ) | 0.5 (fail) | 0.6 (succ) | 0.9 (succ): |s - y| each, over 5
    assert s.ece == pytest.approx((0.2 + 0.6 + 0.5 + 0.4 + 0.1) / 5)
    assert s.best_threshold == pytest.approx(0.4)  # acc 4/5 at 0.4 and 0.6; F1 6/7 beats 4/5


def test_summary_of_one_class_is_undefined_not_invented():
    s = m.summarize_judge([0.3, 0.8], [1, 1], 0.5)
    assert s.auroc is None and s.fpr is None and s.score_failure is None and s.best_threshold is None
    assert s.fnr == 0.5 and s.score_success == pytest.approx(0.55) and s.ece == pytest.approx((0.7 + 0.2) / 2)
    empty = m.summarize_judge([], [], 0.5)
    assert empty.episodes == 0 and empty.ece is None and empty.auroc is None


def test_summary_by_group_splits_by_task():
    groups = ["a", "b", "a", "b", "a"]
    by = m.summarize_by_group(SCORES, LABELS, groups, 0.5)
    assert list(by) == ["a", "b"]
    assert by["a"].episodes == 3 and by["a"].auroc == pytest.approx(1.0)  # a: succ 0.9, 0.4; fail 0.2
    assert by["b"].auroc == pytest.approx(1.0) and by["b"].fpr == 1.0  # b: succ 0.6; fail 0.5 >= 0.5


def test_live_audit_scalars_window_and_tasks():
    audit = JudgeAudit(threshold=0.5)
    assert audit.scalars() == {}  # nothing judged yet: nothing to say
    for score, label, task in zip(SCORES, LABELS, ["t0", "t1", "t0", "t1", "t0"], strict=True):
        audit.record(task, f"task {task}", score, bool(label))
    sc = audit.scalars()
    assert sc["vlm_audit/auroc"] == pytest.approx(5 / 6) and sc["vlm_audit/fpr"] == pytest.approx(0.5)
    assert sc["vlm_audit/t0/auroc"] == pytest.approx(1.0) and sc["vlm_audit/t0/episodes"] == 3
    assert sc["vlm_audit/t0/best_threshold"] == pytest.approx(0.4)  # 0.4 and 0.9 succeed, 0.2 fails
    audit.new_window()
    audit.record("t2", "task t2", 0.7, True)
    sc = audit.scalars()
    assert "vlm_audit/auroc" not in sc and "vlm_audit/t0/episodes" not in sc  # undefined, and a new window
    assert sc["vlm_audit/fnr"] == 0.0 and sc["vlm_audit/t2/score_success"] == pytest.approx(0.7)


def test_task_key():
    assert task_key(3, "anything") == "task3" and task_key(np.int64(0), "x") == "task0"
    assert task_key(None, "Put the bowl on the plate!") == "put_the_bowl_on_the_plate"


def test_canary_tally():
    tally = CanaryTally()
    tally.record_probe("static", 0.2)
    tally.record_probe("static", 0.4)
    tally.record_probe("reversed", None)
    tally.record_real(0.9, True)
    tally.record_real(0.1, False)
    tally.record_real(0.3, False)
    assert tally.scalars() == pytest.approx(
        {
            "vlm_canary/static": 0.3,
            "vlm_canary/real_success": 0.9,
            "vlm_canary/real_failure": 0.2,
            "vlm_canary/failed": 1.0,
        }
    )
    tally.new_window()
    assert tally.scalars() == {"vlm_canary/failed": 0.0}


def test_transforms_are_exact():
    frames = np.arange(4 * 2 * 2 * 3, dtype=np.uint8).reshape(4, 2, 2, 3)
    assert np.array_equal(static_frames(frames), np.stack([frames[0]] * 4))
    assert np.array_equal(reversed_frames(frames), frames[[3, 2, 1, 0]])
    rng = np.random.default_rng(0)
    assert other_task("a", ["a", "b"], rng) == "b" and other_task("a", ["a", " a "], rng) is None
    probes, skipped = make_probes(7, frames, "a", ["static", "reversed", "wrong_task"], ["a"], rng)
    assert [p.kind for p in probes] == ["static", "reversed"] and skipped == ["wrong_task"]
    assert probes[0].request_id == "canary-static-7"


def test_selector_probes_the_fraction_batch_by_batch():
    sel = CanarySelector(0.1, seed=1)
    per_batch = [len(sel.select(64)) for _ in range(10)]
    assert per_batch == [6, 6, 7, 6, 7, 6, 6, 7, 6, 7] and sum(per_batch) == 64
    singles = [len(CanarySelector(0.1).select(1)) for _ in range(3)]
    assert singles == [0, 0, 0]
    sel = CanarySelector(0.1)
    assert sum(len(sel.select(1)) for _ in range(30)) == 3  # one ending episode at a time: every 10th
    assert list(CanarySelector(1.0).select(3)) == [0, 1, 2]


def test_planner_respects_room_and_task_pool():
    frames = [np.zeros((2, 2, 2, 3), np.uint8)] * 4
    planner = CanaryPlanner(1.0, extra_tasks=["other"])
    probes = planner.plan([0, 1, 2, 3], ["t"] * 4, frames, room=5)
    assert len(probes) == 5 and planner.skipped == 7
    assert {p.task for p in probes if p.kind == "wrong_task"} == {"other"}


def test_client_side_modules_stay_light():
    code = (
        "import sys, reward_client.rlinf.hook, reward_client.rlinf.audit, reward_client.rlinf.canary\n"
        "import reward_client.judge_metrics\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'sklearn', 'fastapi', 'reward_server', 'transformers', 'scipy'))\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_voc_of_curves_per_task_and_window():
    audit = JudgeAudit(threshold=0.5)
    audit.record("t0", "task t0", 0.9, True, [0.1, 0.5, 0.9])  # rises: 1
    audit.record("t0", "task t0", 0.2, False, [0.4, 0.3, 0.2])  # falls: -1
    audit.record("t1", "task t1", 0.6, True, [0.2, None, 0.6])  # a point without a number is left out
    audit.record("t1", "task t1", 0.5, False)  # a single score: no curve, no VOC
    sc = audit.scalars()
    assert sc["vlm_audit/t0/voc"] == pytest.approx(0.0) and sc["vlm_audit/t1/voc"] == pytest.approx(1.0)
    assert sc["vlm_audit/voc"] == pytest.approx(1 / 3) and sc["vlm_audit/episodes"] == 4
    audit.new_window()
    audit.record("t0", "task t0", 0.5, True, [0.5, 0.5])  # flat: undefined, not logged
    assert not [k for k in audit.scalars() if k.endswith("voc")]
    tally = CanaryTally()
    tally.record_probe("reversed", 0.1, [0.5, 0.3, 0.1])
    tally.record_probe("static", 0.2, [0.2, 0.2])
    assert tally.scalars()["vlm_canary/reversed_voc"] == pytest.approx(-1.0)
    assert "vlm_canary/static_voc" not in tally.scalars()
