"""The judge-evaluation tool: metrics against hand-computed values, then the whole tool end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reward_client.video_io import write_mp4
from reward_server.media.video import decode_frames
from reward_tools import eval_metrics as m
from reward_tools.eval_audit import build_probes
from reward_tools.evaluate import load_manifest
from reward_tools.evaluate import main as evaluate_main
from tests.helpers.episodes import audit_by_hand, episode_frames

TASKS = ("put the bowl on the plate", "open the top drawer")


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
def labeled_set(tmp_path):
    rows = []
    for i in range(8):
        success = i % 2 == 0
        frames = episode_frames(12, seed=i)
        if success:
            frames[-4:, :, :] = (40, 200, 40)  # a visibly different ending
        path = write_mp4(frames, tmp_path / f"ep{i}.mp4")
        rows.append(
            {
                "video": path.split("/")[-1],
                "task": TASKS[i // 4],  # two tasks, each with two successes and two failures
                "success": int(success),
                "progress": 100 if success else 10 * i,
                "trajectory": f"traj{i % 2}",
                "t": i // 2,
            }
        )
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


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


@pytest.mark.engine
def test_evaluate_end_to_end_writes_report_and_plots(hf_server, labeled_set, tmp_path):
    out = tmp_path / "report" / "judge"
    code = evaluate_main(
        [
            "--manifest",
            str(labeled_set),
            "--server",
            f"tiny={hf_server.url}",
            "--score-mode",
            "logprob",
            "--score-mode",
            "auto",
            "--nframes",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.with_suffix(".json").read_text())
    by_config = {c["config"]: c for c in report["configs"]}
    assert set(by_config) == {"tiny/logprob", "tiny/auto"}
    lp = by_config["tiny/logprob"]
    assert lp["episodes"] == 8 and lp["parse_failure_rate"] == 0.0 and 0.0 <= lp["auroc"] <= 1.0
    assert sum(b["count"] for b in lp["calibration"]) == 8 and "voc" in lp and "spearman_progress" in lp
    auto = by_config["tiny/auto"]  # random weights: some replies hold one number, others none
    assert sum(auto["statuses"].values()) == 8
    failures = sum(v for k, v in auto["statuses"].items() if k in ("no_number", "multiple_numbers", "missing_answer"))
    assert auto["parse_failure_rate"] == pytest.approx(failures / 8) and auto["scored"] == 8 - failures
    md = out.with_suffix(".md").read_text()
    assert "| tiny/logprob | 8 | 0.0% |" in md and f"| tiny/auto | 8 | {failures / 8:.1%} |" in md
    # per task and canaries: the live audit's numbers, checked by hand from the episodes' scores
    labels = [i % 2 == 0 for i in range(8)]
    for t, task in enumerate(TASKS):
        rows = range(4 * t, 4 * t + 4)
        hand = audit_by_hand([lp["scores"][i] for i in rows], [labels[i] for i in rows], 0.5)
        assert lp["tasks"][task] == pytest.approx({**hand, "successes": 2})
    canary = lp["canary"]
    assert canary["real_success"] == pytest.approx(np.mean([lp["scores"][i] for i in range(0, 8, 2)]))
    for kind in ("static", "reversed", "wrong_task"):
        assert canary[f"{kind}_n"] == 8 and canary[f"{kind}_failed"] == 0 and 0 <= canary[kind] <= 1
    assert "## Canaries" in md and f"| {TASKS[1]} | 4 | 2 |" in md
    for png in (
        "judge-roc.png",
        "judge-tiny_logprob-hist.png",
        "judge-tiny_logprob-reliability.png",
        "judge-tiny_logprob-canary.png",
        "judge-tiny_logprob-tasks.png",
    ):
        data = (out.parent / png).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 5000
    assert not math.isnan(lp["latency_ms_p50"])
