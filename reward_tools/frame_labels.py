"""The labeling rule: from the judge's answer about an episode to a success label per frame.

The judge sees `nframes` frames picked evenly from the episode's T frames (first and last
included; reward_protocol.frames.FrameSpec.pick_steps, the server's own pick, done here so only
those frames travel). Two rules:

- `curve` (progress_points K > 1): the judge answers K progress values, point k judging the
  frames up to the k-th prefix's last frame f_k (reward_protocol.progress, reward_client.rlinf.dense).
  The first point whose value is >= threshold marks success: frames f_k .. T-1 are labeled 1,
  earlier frames 0. No point at or above the threshold: every frame 0. A point without a value
  (its answer did not parse) marks nothing. The episode's score is the curve's highest value,
  so "score >= threshold" and "some frame labeled 1" are the same statement.
- `score` (one value for the whole episode): score >= threshold labels the last `last_frames`
  frames 1 and the rest 0; below it, every frame 0. The judge says nothing about when success
  came, only that the last frame shows it.

A threshold of 0.5 is the hook's `success_threshold` default; the agreement report's
`best_threshold` (against the simulator, where it has labels) says which one would have agreed
best on your episodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from reward_client.rlinf.dense import model_frame_count, point_frames
from reward_protocol.frames import FrameSpec


class LabelRule(BaseModel):
    """How the judge's answer becomes frame labels (written into the dataset's metadata)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["curve", "score"] = "curve"
    threshold: float = Field(0.5, ge=0.0, le=1.0, description="success at a value >= threshold")
    points: int = Field(8, ge=1, le=256, description="curve: the progress points asked for (K)")
    last_frames: int = Field(1, ge=1, description="score: how many final frames a success labels 1")

    @model_validator(mode="after")
    def _curve_needs_points(self) -> LabelRule:
        if self.kind == "curve" and self.points < 2:
            raise ValueError("the curve rule needs points >= 2 (use kind 'score' for one value per episode)")
        return self

    def points_for(self, spec: FrameSpec, nframes: int, frames: int) -> int:
        """Points to ask for an episode of `frames` frames: 1 for `score`, else K capped by the
        frames the model sees (as the RLinf hook caps it)."""
        if self.kind == "score":
            return 1
        return min(self.points, model_frame_count(spec, nframes, frames))


def judge_picks(spec: FrameSpec, nframes: int, frames: int) -> list[int]:
    """The frame indices the judge sees (the server's own pick: sending exactly these, it picks
    them all again, so point k's prefix ends where reward_client.rlinf.dense says)."""
    return spec.pick_steps(frames, nframes)


def episode_score(rule: LabelRule, score: float | None, curve: Sequence[float | None] | None) -> float | None:
    """The one number the rule compares with the threshold (None: the judge gave no value)."""
    if rule.kind == "curve" and curve:
        values = [v for v in curve if v is not None]
        return max(values) if values else None
    return score


def frame_labels(
    rule: LabelRule,
    frames: int,
    score: float | None,
    curve: Sequence[float | None] | None,
    ends: Sequence[int] | None,
) -> np.ndarray:
    """bool [frames]: the rule applied to one judged episode. `ends`: for each curve point, the
    frame index its prefix ends at (from point_ends)."""
    labels = np.zeros(frames, dtype=bool)
    if rule.kind == "curve" and curve and ends:
        for value, end in zip(curve, ends, strict=True):
            if value is not None and value >= rule.threshold:
                labels[end:] = True
                break
        return labels
    if score is not None and score >= rule.threshold:
        labels[max(frames - rule.last_frames, 0) :] = True
    return labels


def point_ends(spec: FrameSpec, nframes: int, picks: Sequence[int], points: int) -> list[int]:
    """For each of `points` curve points, the episode frame index of the last frame its prefix shows."""
    return point_frames(picks, nframes, points, spec)


__all__ = ["LabelRule", "episode_score", "frame_labels", "judge_picks", "point_ends"]
