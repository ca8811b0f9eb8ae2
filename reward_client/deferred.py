"""Asynchronous judging (`reward_model.async`): the bookkeeping that puts an episode's judged
reward where the synchronous hook would have put it, after the fact.

In async mode the env hands RLinf the reward it would give if the ended episode's value were
still 0 (the value before any episode ends), and the judge's answer arrives while the rollout
goes on. The difference to the synchronous rewards is then known exactly, step by step:

- under `use_rel_reward` the value's jump from 0 to v gives `reward_coef x v` at the done step
  only (plus, for a progress curve, the moves of reward_client.dense);
- without it the value stands at every step from the done step until the env resets (the
  "tail"), and each of those steps gets `reward_coef x v`.

RLinf's env worker (rlinf_patches/env_worker.patch) hands the hook its rollout rewards after
every chunk step; the hook adds the difference there by absolute step (the env's action count
since the hook was built), so it does not matter where the episode started (auto reset) or how
many chunks later the answer came. The env's own episode metrics (`return`, `reward`, the
`vlm_*` values), which the worker read from `infos["episode"]` before the answer came, are
corrected in place in the dicts the worker keeps (`Record`), as the env would have computed them.
Numpy only, like the rest of the env-side client; the records may hold torch tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reward_client.dense import Move, PlacementError


@dataclass(frozen=True)
class ReturnRule:
    """How an env adds its step rewards into `infos["episode"]["return"]` and `["reward"]`."""

    stops_at_success: bool  # LIBERO: a step counts only until the env's first success (included)
    reward_len_at_success: bool  # LIBERO: `reward` = return / length at first success, else / elapsed


LIBERO_RETURNS = ReturnRule(stops_at_success=True, reward_len_at_success=True)
MANISKILL_RETURNS = ReturnRule(stops_at_success=False, reward_len_at_success=False)


@dataclass
class Outcome:
    """What the judge (or the fallback) made of one episode."""

    score: float
    value: float
    fallback: bool
    latency_ms: float
    curve: list[float | None] | None = None
    moves: list[Move] = field(default_factory=list)  # episode action index -> reward moved there


@dataclass
class DeferredEpisode:
    """An ended episode whose reward has not been placed yet (async mode)."""

    env: int
    start_t: int  # absolute index of the episode's first action
    end_t: int  # absolute index of its done action
    counted_end: bool  # the env's return counted the done step's reward
    success: bool  # the env's success flag at the done step (the `env_success` fallback)
    steps: list[int]  # the frame steps sent (for a curve's moves)
    length: int  # frames recorded (actions + the reset frame)
    task: str
    task_id: Any
    success_t: int = -1  # absolute step of the env's first success in the episode (-1: none yet)
    tail: list[tuple[int, bool]] = field(default_factory=list)  # (step, counted) after end_t, value standing
    close_t: int | None = None  # the last step of the episode (the env reset, or the epoch ended)
    outcome: Outcome | None = None

    def deltas(self, coef: float, rel: bool) -> list[tuple[int, float, bool]]:
        """(absolute step, reward to add, whether the env's return counted that step): what the
        synchronous hook's rewards have beyond the ones the env gave."""
        value = self.outcome.value
        if rel:
            out = [(self.end_t, coef * value, self.counted_end)]
            # a curve's moves live in the rollout buffer only; the env's return never saw them
            out += [(self.start_t + action, amount, False) for action, amount in self.outcome.moves]
            return out
        return [(t, coef * value, counted) for t, counted in [(self.end_t, self.counted_end), *self.tail]]


@dataclass
class Record:
    """A `infos["episode"]` dict the env worker read at a chunk step (and may log)."""

    last_t: int  # the last step of that chunk
    info: dict[str, Any]
    rows: dict[int, int]  # env -> row of the info's tensors


def locate(step: int, now: int, per_chunk: int, earlier: Sequence[Any]) -> tuple[int, int]:
    """(chunks back from the current one, slot) of an absolute step, the current chunk holding
    steps [now - per_chunk, now)."""
    offset = step - (now - per_chunk)
    back, slot = -(offset // per_chunk), offset % per_chunk
    if back < 0 or back > len(earlier):
        raise PlacementError(
            f"a judged reward for step {step} cannot be placed: the env worker holds steps "
            f"{now - per_chunk * (len(earlier) + 1)}..{now - 1} of this rollout (is rlinf_patches/env_worker.patch "
            "applied, and does the worker keep the rollout's rewards until the epoch ends?)"
        )
    return back, slot


def add(target: Any, row: int, slot: int | None, amount: float) -> None:
    """target[row] or target[row, slot] += amount, for numpy arrays and torch tensors alike."""
    if slot is None:
        target[row] = target[row] + amount
    else:
        target[row, slot] = target[row, slot] + amount


def full_like(like: Any, n: int, value: float) -> Any:
    """An n-vector of `value` of the same kind (numpy or torch, host) as `like`, float32."""
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.full((n,), float(value), dtype=torch.float32)
    return np.full(n, value, dtype=np.float32)


__all__ = [
    "LIBERO_RETURNS",
    "MANISKILL_RETURNS",
    "DeferredEpisode",
    "Outcome",
    "Record",
    "ReturnRule",
    "add",
    "full_like",
    "locate",
]
