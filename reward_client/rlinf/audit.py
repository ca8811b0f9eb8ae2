"""The judge audited live, against LIBERO's own success flag, one rollout epoch at a time.

Every episode the judge scores also has LIBERO's ground truth (did the simulator's success check
fire at or before the judged step). The audit keeps both, per task, for the current window (one
rollout epoch: from a reset of every env to the next) and turns them into scalars for
`infos["episode"]`, which RLinf logs as `env/<key>`. The ground truth is only measured against:
nothing here feeds a reward. No model calls; numpy only.

How a window's aggregate reaches TensorBoard: RLinf reads `infos["episode"]` at the last chunk
step of each rollout epoch and logs, per training step, the mean over every env slot of every env
worker and rollout epoch. The audit writes the window's value into every env slot of its worker,
so the logged scalar is the mean of the per-(worker, rollout epoch) values: the window's value
itself with one env worker and `rollout_epoch: 1`. A value that is undefined for a window
(AUROC with one class missing) is left out of that window's `infos["episode"]`, so the mean runs
over the windows where it is defined, and a step where it is defined nowhere has no point.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from reward_client.judge_metrics import JudgeSummary, mean_or_none, summarize_by_group, summarize_judge
from reward_client.rlinf.canary import CANARY_KINDS
from reward_protocol.progress import value_order_correlation

logger = logging.getLogger(__name__)

AUDIT_PREFIX = "vlm_audit"
CANARY_PREFIX = "vlm_canary"
# JudgeSummary fields logged, in this order; `successes` is left out (env/success_once has it)
AUDIT_FIELDS = ("episodes", "auroc", "fpr", "fnr", "ece", "score_success", "score_failure", "best_threshold")


def task_key(task_id: int | None, description: str) -> str:
    """A short, stable TensorBoard name for a task: LIBERO's task id, or a slug of its text."""
    if task_id is not None:
        return f"task{int(task_id)}"
    return re.sub(r"[^a-z0-9]+", "_", description.lower()).strip("_")[:80] or "task"


def summary_scalars(prefix: str, summary: JudgeSummary) -> dict[str, float]:
    """`prefix/<field>` for every defined field of a summary."""
    values = asdict(summary)
    return {f"{prefix}/{name}": float(values[name]) for name in AUDIT_FIELDS if values[name] is not None}


class JudgeAudit:
    """Scores and ground truth of the judged episodes of the current window."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self._named: dict[str, str] = {}  # task key -> description, to log each mapping once
        self.new_window()

    def new_window(self) -> None:
        self.scores: list[float] = []
        self.labels: list[bool] = []
        self.tasks: list[str] = []
        self.vocs: dict[str, list[float]] = {}  # task -> VOC of each judged curve (episodes with one)
        self._scalars: dict[str, float] | None = {}

    def record(
        self, task: str, description: str, score: float, success: bool, curve: Sequence[float | None] | None = None
    ) -> None:
        if task not in self._named:
            self._named[task] = description
            logger.info("VLM audit: %s/%s/... is task %r", AUDIT_PREFIX, task, description)
        self.scores.append(float(score))
        self.labels.append(bool(success))
        self.tasks.append(task)
        voc = None if curve is None else value_order_correlation(curve)
        if voc is not None:
            self.vocs.setdefault(task, []).append(voc)
        self._scalars = None  # recomputed once, when next asked for

    def scalars(self) -> dict[str, float]:
        """`vlm_audit/<field>` overall and `vlm_audit/<task>/<field>` per task, defined ones only."""
        if self._scalars is None:
            scores, labels = np.array(self.scores), np.array(self.labels, dtype=bool)
            out = summary_scalars(AUDIT_PREFIX, summarize_judge(scores, labels, self.threshold))
            for task, summary in summarize_by_group(scores, labels, self.tasks, self.threshold).items():
                out.update(summary_scalars(f"{AUDIT_PREFIX}/{task}", summary))
            for task, vocs in self.vocs.items():
                out[f"{AUDIT_PREFIX}/{task}/voc"] = float(np.mean(vocs))
            if self.vocs:
                out[f"{AUDIT_PREFIX}/voc"] = float(np.mean([v for vocs in self.vocs.values() for v in vocs]))
            self._scalars = out
        return self._scalars


class CanaryTally:
    """Scores of the canary probes of the current window, beside the real episodes' by label."""

    def __init__(self, kinds: Sequence[str] = CANARY_KINDS):
        self.kinds = tuple(kinds)
        self.new_window()

    def new_window(self) -> None:
        self.scores: dict[str, list[float]] = {kind: [] for kind in self.kinds}
        self.vocs: dict[str, list[float]] = {kind: [] for kind in self.kinds}
        self.real: dict[bool, list[float]] = {True: [], False: []}
        self.failed = 0

    def record_probe(self, kind: str, score: float | None, curve: Sequence[float | None] | None = None) -> None:
        if score is None:
            self.failed += 1
            return
        self.scores[kind].append(float(score))
        voc = None if curve is None else value_order_correlation(curve)
        if voc is not None:
            self.vocs[kind].append(voc)

    def record_real(self, score: float, success: bool) -> None:
        self.real[bool(success)].append(float(score))

    def scalars(self) -> dict[str, float]:
        """`vlm_canary/<kind>` (mean probe score), `vlm_canary/<kind>_voc` (mean VOC of the probes'
        curves, where they have one), `vlm_canary/real_success` and `real_failure` (mean score of
        this window's real episodes by LIBERO's flag), `vlm_canary/failed`."""
        means = {kind: mean_or_none(values) for kind, values in self.scores.items()}
        means.update({f"{kind}_voc": mean_or_none(values) for kind, values in self.vocs.items()})
        means["real_success"] = mean_or_none(self.real[True])
        means["real_failure"] = mean_or_none(self.real[False])
        out = {f"{CANARY_PREFIX}/{name}": value for name, value in means.items() if value is not None}
        out[f"{CANARY_PREFIX}/failed"] = float(self.failed)
        return out
