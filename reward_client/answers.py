"""Answers of the reward server, read and checked before anything in them is believed.

A faulty server or proxy can answer anything; what cannot be right raises RewardProtocolError (the
client counts and retries it like a lost connection), so nothing but a judge's answer becomes a reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import httpx
from pydantic import ValidationError

from reward_client.errors import RewardProtocolError, RewardRequestError, RewardServerError
from reward_protocol.score import BatchItem, BatchScoreResponse, ErrorBody, ScoreResponse


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
    try:
        return model.model_validate(response.json())
    except (ValueError, ValidationError) as exc:
        raise RewardProtocolError(f"the answer is not the documented schema: {exc}") from None


def _check_value(value: float | None, where: str) -> None:
    if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise RewardProtocolError(f"{where} is {value!r}; a score is a finite number in [0, 1] or null")


def check_response(response: ScoreResponse, where: str = "the answer") -> ScoreResponse:
    """A score and curve points that can be rewards (finite, in [0, 1], or null), else RewardProtocolError."""
    _check_value(response.score, f"{where}'s score")
    for k, value in enumerate(response.progress or ()):
        _check_value(value, f"{where}'s progress[{k}]")
    return response


def check_batch(items: Sequence[BatchItem], count: int) -> list[BatchItem]:
    """The items of a batch answer for `count` episodes, in index order, if they can be right:
    exactly one per episode (indices 0..count-1, each once), each a response or an error, every
    score in [0, 1]; else RewardProtocolError saying what was wrong."""
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
            check_response(item.response, f"item {item.index}")
    return ordered


def batch_reader(count: int) -> Callable[[httpx.Response], list[BatchItem]]:
    return lambda response: check_batch(parse_answer(BatchScoreResponse, response).results, count)


def score_reader(response: httpx.Response) -> ScoreResponse:
    return check_response(parse_answer(ScoreResponse, response))
