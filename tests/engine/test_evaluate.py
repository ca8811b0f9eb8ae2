"""The judge-evaluation tool end to end on the transformers engine: the report and its plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from reward_tools.evaluate import main as evaluate_main
from tests.helpers.episodes import LABELED_TASKS as TASKS
from tests.helpers.episodes import audit_by_hand, write_labeled_set


@pytest.fixture
def labeled_set(tmp_path) -> Path:
    return write_labeled_set(tmp_path)


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
