"""Answers of the reward server, read and checked before anything in them is believed.

A faulty server or proxy can answer anything; what cannot be right raises RewardProtocolError (the
client counts and retries it like a lost connection), so nothing but a judge's answer becomes a reward.

Answers are read strictly, as the JSON they are (`parse_answer`): a score is a JSON number, not
`true` or `"0.7"`; an index or a count an integer, not `"1"`, `true` or `1.0`; a parse status one
of its names. Then what the schema cannot say is checked against what was asked (`check_response`,
`check_batch`): scores finite in [0, 1] or null, a curve of exactly the K points asked for whose
last point is the score, and a parse status that agrees with the score (a failed parse carries
no score, a null score names a failed parse).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import httpx
from pydantic import ValidationError

from reward_client.errors import RewardProtocolError, RewardRequestError, RewardServerError
from reward_protocol.score import (
    FAILED_PARSE_STATUSES,
    BatchItem,
    BatchScoreResponse,
    ErrorBody,
    ScoreResponse,
)

_FAILED = ", ".join(sorted(status.value for status in FAILED_PARSE_STATUSES))


def raise_for_answer(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        error = ErrorBody.model_validate(response.json()).error
        kind, message = error.type, error.message
    except (ValueError, ValidationError):
        kind, message = "unknown", response.text[:300]
    if 400 <= response.status_code < 500:
        raise RewardRequestError(response.status_code, kind, message)
    raise RewardServerError(f"reward server error {response.status_code} {kind}: {message}")


def parse_answer(model, response: httpx.Response):
    """The answer as `model`, validated strictly from its JSON bytes (pydantic's lax mode would
    read `true` as 1.0, `"0.7"` as 0.7 and `1.0` as the index 1)."""
    try:
        return model.model_validate_json(response.content, strict=True)
    except ValidationError as exc:
        raise RewardProtocolError(f"the answer is not the documented schema: {exc}") from None


def _check_value(value: float | None, where: str) -> None:
    if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise RewardProtocolError(f"{where} is {value!r}; a score is a finite number in [0, 1] or null")


def check_response(response: ScoreResponse, points: int = 1, where: str = "the answer") -> ScoreResponse:
    """A response that can be believed for a request of `points` progress points, else
    RewardProtocolError: score and curve points finite in [0, 1] or null; with points > 1 a curve
    of exactly that many points (one given for points 1 has one); the score equal to the curve's
    last point; a failed parse status with no score, and no null score without one."""
    score, progress, status = response.score, response.progress, response.parse_status
    _check_value(score, f"{where}'s score")
    if progress is not None or points > 1:
        if progress is None:
            raise RewardProtocolError(f"{where} has no progress curve; {points} points were asked for")
        if len(progress) != points:
            raise RewardProtocolError(f"{where}'s progress curve has {len(progress)} points; {points} were asked for")
        for k, value in enumerate(progress):
            _check_value(value, f"{where}'s progress[{k}]")
        if progress[-1] != score:
            raise RewardProtocolError(
                f"{where}'s score {score!r} is not its curve's last point {progress[-1]!r}; the score is that point"
            )
    if status in FAILED_PARSE_STATUSES and score is not None:
        raise RewardProtocolError(
            f"{where}'s parse_status {status.value!r} says the answer gave no score, yet its score is {score!r}"
        )
    if status not in FAILED_PARSE_STATUSES and score is None:
        raise RewardProtocolError(
            f"{where}'s score is null with parse_status {status.value!r}; a null score comes with one of {_FAILED}"
        )
    return response


def check_batch(items: Sequence[BatchItem], points: int | Sequence[int]) -> list[BatchItem]:
    """The items of a batch answer, in index order, if they can be right for the episodes asked
    (`points`: each episode's progress_points, in order; an int n: n episodes of one score each):
    exactly one item per episode (indices 0..n-1, each once), each a response or an error, every
    response right for its episode (check_response); else RewardProtocolError saying what was wrong."""
    asked = [1] * points if isinstance(points, int) else list(points)
    count = len(asked)
    if len(items) != count:
        raise RewardProtocolError(f"the answer has {len(items)} items for {count} episodes")
    ordered = sorted(items, key=lambda i: i.index)
    indices = [item.index for item in ordered]
    if indices != list(range(count)):
        shown = indices if count <= 8 else [*indices[:8], "..."]
        raise RewardProtocolError(
            f"the answer's indices are {shown}; {count} episodes need each of 0..{count - 1} once"
        )
    for item in ordered:
        if (item.response is None) == (item.error is None):
            what = "neither a response nor an error" if item.response is None else "both a response and an error"
            raise RewardProtocolError(f"item {item.index} has {what}")
        if item.response is not None:
            check_response(item.response, asked[item.index], f"item {item.index}")
    return ordered


def batch_reader(points: int | Sequence[int]) -> Callable[[httpx.Response], list[BatchItem]]:
    """Reads a batch answer for episodes asked with these progress_points (check_batch)."""
    return lambda response: check_batch(parse_answer(BatchScoreResponse, response).results, points)


def score_reader(points: int = 1) -> Callable[[httpx.Response], ScoreResponse]:
    """Reads a /score answer for a request of `points` progress points (check_response)."""
    return lambda response: check_response(parse_answer(ScoreResponse, response), points)
