"""A request's deadline as a value: when its handling started, how long it may take, and what set
that bound (the client's X-Reward-Deadline-S, or --request-timeout-s). The HTTP layer makes one per
request and hands it down; every step that waits (reading the body, admission, the engine) reads the
same value, so an error can name the bound that ended it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from reward_protocol.score import DEADLINE_HEADER
from reward_server.request_errors import BadRequest


@dataclass(frozen=True)
class Deadline:
    started: float  # time.perf_counter() when the request's handling began
    seconds: float  # how long its answer may take from then
    why: str  # what set `seconds`, for the error that names it

    @classmethod
    def of_request(cls, header: str | None, request_timeout_s: float, started: float) -> Deadline:
        """The client's X-Reward-Deadline-S (seconds it still waits), capped by --request-timeout-s;
        an invalid header is a 400 naming it."""
        if header is None:
            return cls(started, request_timeout_s, "--request-timeout-s")
        try:
            seconds = float(header)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise BadRequest(f"{DEADLINE_HEADER} must be a positive number of seconds, got {header[:40]!r}")
        if seconds < request_timeout_s:
            return cls(started, seconds, f"the client's {DEADLINE_HEADER}")
        return cls(started, request_timeout_s, "--request-timeout-s")

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.seconds - (time.perf_counter() - self.started))
