"""The judge-evaluation tool: metrics against hand-computed values, then the whole tool end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from reward_server.media.video import decode_frames
from reward_tools import eval_metrics as m
from reward_tools.eval_audit import build_probes
from reward_tools.evaluate import load_manifest
from tests.helpers.episodes import LABELED_TASKS as TASKS
from tests.helpers.episodes import write_labeled_set


def test_auroc_by_hand():
    # successes 0.9, 0.6, 0.4; failures 0.5, 0.2: pairs won 2+1+0... = (0.9>0.5,0.9>0.2,0.6>0.5,0.6>0.2,0.4<0.5,0.4>0.2)
    assert m.auroc([0.9, 0.6, 0.4, 0.5, 0.2], [1, 1, 1, 0, 0]) == pytest.approx(5 / 6)
    assert m.auroc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)  # a tie counts one half
    assert m.auroc([0.1, 0.9], [1, 0]) == pytest.approx(0.0)
    assert m.auroc([0.3, 0.4], [1, 1]) is None


def test_roc_curve_ends_at_one_one_and_starts_at_zero():
    fpr, tpr, thr = m.roc_curve([0.9, 0.6, 0.4, 0.5, 0.2], [1, 1, 1, 0, 0])
    assert (fpr[0], tpr[0]) == (0, 0) and (fpr[-1], tpr[-1]) == (1, 1)
    assert list(thr[1:]) == [0.9, 0.6, 0.5, 0.4, 0.2]
    area = float(np.sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(5 / 6)  # trapezoids agree with the rank formula


def test_classification_at_thresholds_by_hand():
    scores, labels = [0.9, 0.6, 0.4, 0.5, 0.2], [1, 1, 1, 0, 0]
    c = m.classify_at(scores, labels, 0.5)  # predicted success: 0.9, 0.6, 0.5 -> tp 2, fp 1, fn 1
    assert (c.accuracy, c.precision, c.recall) == pytest.approx((3 / 5, 2 / 3, 2 / 3))
    assert c.f1 == pytest.approx(2 / 3)
    best = m.best_threshold(scores, labels)  # 0.6 -> tp2 fp0 fn1 tn2: acc 4/5; 0.4 -> tp3 fp1 tn1: 4/5
    assert best.accuracy == pytest.approx(4 / 5)
    assert best.threshold == pytest.approx(0.4) and best.f1 == pytest.approx(6 / 7)  # higher F1 wins the tie


def test_calibration_bins_and_ece_by_hand():
    bins, ece = m.calibration([0.05, 0.15, 0.95, 1.0], [0, 1, 1, 1], bins=10)
    assert [b.count for b in bins] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 2]  # 1.0 falls in the last bin
    assert bins[9].mean_score == pytest.approx(0.975) and bins[9].success_rate == 1.0
    assert bins[2].mean_score is None
    # |0.05-0| + |0.15-1| + 2*|0.975-1|, over 4
    assert ece == pytest.approx((0.05 + 0.85 + 0.05) / 4)


def test_spearman_and_voc_by_hand():
    assert m.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert m.spearman([1, 2, 3], [3, 1, 2]) == pytest.approx(-0.5)
    assert m.spearman([1, 1, 1], [1, 2, 3]) is None
    # trajectory a: values rise with time (rho 1); b: values fall (rho -1); c has one clip (ignored)
    voc = m.value_order_correlation([0.1, 0.5, 0.9, 0.8, 0.2, 0.3], ["a", "a", "a", "b", "b", "c"], [0, 1, 2, 0, 1, 0])
    assert voc == pytest.approx(0.0)
    assert m.value_order_correlation([0.1, 0.2], ["a", "a"], [0, 1]) == pytest.approx(1.0)


@pytest.fixture
def labeled_set(tmp_path) -> Path:
    return write_labeled_set(tmp_path)


def test_offline_probes_are_the_live_ones(labeled_set):
    episodes = load_manifest(labeled_set)
    probes = build_probes(episodes, nframes=8, fraction=1.0)
    assert [(p.kind, p.source) for p in probes[:3]] == [("static", 0), ("reversed", 0), ("wrong_task", 0)]
    assert len(probes) == 3 * len(episodes)
    for p in probes:
        with open(episodes[p.source].video, "rb") as fh:
            sampled = decode_frames(fh, 8)  # what the server would see
        if p.kind == "static":
            assert np.array_equal(p.frames, np.repeat(sampled[:1], len(sampled), axis=0))
        elif p.kind == "reversed":
            assert np.array_equal(p.frames, sampled[::-1])
        else:
            assert np.array_equal(p.frames, sampled) and p.task == TASKS[1 - p.source // 4]
    assert len(build_probes(episodes, nframes=8, fraction=0.25)) == 2 * 3
    assert build_probes(episodes, nframes=8, fraction=0.0) == []
