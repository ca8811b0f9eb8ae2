"""Asynchronous judging (`reward_model.async`): the bookkeeping that puts an episode's judged
reward where the synchronous hook would have put it, after the fact.

In async mode the env hands RLinf the reward it would give if the ended episode's value were
still 0 (the value before any episode ends), and the judge's answer arrives while the rollout
goes on. The difference to the synchronous rewards is then known exactly, step by step:

- under `use_rel_reward` the value's jump from 0 to v gives `reward_coef x v` at the done step
  only (plus, for a progress curve, the moves of reward_client.rlinf.dense);
- without it the value stands at every step from the done step until the env resets (the
  "tail"), and each of those steps gets `reward_coef x v`.

RLinf's env worker (rlinf_patches/env_worker.patch) hands the hook its rollout rewards after
every chunk step; the hook adds the difference there by absolute step (the env's action count
since the hook was built), so it does not matter where the episode started (auto reset) or how
many chunks later the answer came. The env's own episode metrics (`return`, `reward`, the
`vlm_*` values), which the worker read from `infos["episode"]` before the answer came, are
corrected in place in the dicts the worker keeps (`Record`), as the env would have computed them.
`DeferredRewards` is that ledger: the async hook (reward_client.rlinf.hook) hands it each batch
of ended episodes, which it sends on a request thread (reward_client.rlinf.judging does the request),
and the env worker's calls, at which it places what has come. Numpy only, like the rest of the
env-side client; the records may hold torch tensors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reward_client.client import RewardClientError
from reward_client.rlinf.dense import PlacementError
from reward_client.rlinf.judging import Batch, EpisodeJudge, Outcome


@dataclass(frozen=True)
class ReturnRule:
    """How an env adds its step rewards into `infos["episode"]["return"]` and `["reward"]`."""

    stops_at_success: bool  # LIBERO: a step counts only until the env's first success (included)
    reward_len_at_success: bool  # LIBERO: `reward` = return / length at first success, else / elapsed


LIBERO_RETURNS = ReturnRule(stops_at_success=True, reward_len_at_success=True)
MANISKILL_RETURNS = ReturnRule(stops_at_success=False, reward_len_at_success=False)


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


# An env worker places what the judge said after every chunk step; this many steps without a
# placement while answers are owed means RLinf's env worker is not patched.
UNPLACED_STEPS_LIMIT = 4096
NEEDS_WORKER_PATCH = (
    "Async judging needs rlinf_patches/env_worker.patch (bash scripts/apply_rlinf_patches.sh RLINF_DIR), or set "
    "env.train.reward_model.async: False"
)


@dataclass
class InFlight:
    """One batch request on a request thread, and the deferred episodes its answer settles."""

    batch: Batch
    episodes: list[DeferredEpisode]
    future: Future


class DeferredRewards:
    """The async hook's ledger: batches in flight, ended episodes not yet placed, and the
    `infos["episode"]` dicts the env worker read while their values stood. Steps are the hook's
    absolute steps (`t`: actions stepped by every env since the hook was built)."""

    def __init__(
        self, judge: EpisodeJudge, num_envs: int, reward_coef: float, use_rel_reward: bool, returns: ReturnRule
    ):
        self.judge = judge
        self.num_envs = num_envs
        self.reward_coef = reward_coef
        self.rel = use_rel_reward
        self.returns = returns
        self.inflight: list[InFlight] = []
        self.deferred: list[DeferredEpisode] = []  # ended, not yet placed
        self.open: dict[int, DeferredEpisode] = {}  # env -> its deferred episode, while the env has not reset
        self.records: list[Record] = []  # the epoch's infos["episode"] the env worker read
        self.last_place_t = 0
        self._pool: ThreadPoolExecutor | None = None

    # --- the env's side: episodes start, steps pass, episodes end --------------------------------

    def restart(self, envs: Sequence[int], t: int, new_epoch: bool, auto_reset: bool) -> None:
        """Episodes start for envs at step t: an ended episode's value stood until t - 1."""
        if new_epoch and self.deferred and not auto_reset:
            raise RuntimeError(
                f"VLM reward (async): {len(self.deferred)} judged episodes of the last rollout epoch were never placed "
                f"in RLinf's rollout buffer. {NEEDS_WORKER_PATCH}"
            )
        for env in envs:
            episode = self.open.pop(int(env), None)
            if episode is not None:  # auto reset: the value stood until the chunk's last step
                episode.close_t = t - 1

    def stand(self, now: int, counted: np.ndarray, success_t: np.ndarray) -> None:
        """Step `now` passed: the value of each ended episode whose env has not reset stood there."""
        for env, episode in self.open.items():
            episode.tail.append((now, bool(counted[env])))
            episode.success_t = int(success_t[env])

    def submit(self, batch: Batch, end_t: int, start_t: np.ndarray, counted: np.ndarray, success_t: np.ndarray) -> None:
        """Send the batch of episodes that ended at step end_t on a request thread; they are owed
        to the rollout buffer (start_t, counted, success_t: the hook's per-env arrays)."""
        episodes = [
            DeferredEpisode(
                env=e.env,
                start_t=int(start_t[e.env]),
                end_t=end_t,
                counted_end=bool(counted[e.env]),
                success=e.success,
                steps=e.steps,
                length=e.length,
                task=e.task,
                task_id=e.task_id,
                success_t=int(success_t[e.env]),
            )
            for e in batch.ended
        ]
        self.deferred.extend(episodes)
        self.open.update({episode.env: episode for episode in episodes})
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.judge.config.async_batches, thread_name_prefix="vlm-judge")
        self.inflight.append(InFlight(batch, episodes, self._pool.submit(self.judge.call, batch)))

    def check_placed(self, t: int) -> None:
        if self.deferred and t - self.last_place_t > UNPLACED_STEPS_LIMIT:
            raise RuntimeError(
                f"VLM reward (async): {t - self.last_place_t} steps without RLinf's env worker placing a judged "
                f"reward. {NEEDS_WORKER_PATCH}"
            )

    def close(self) -> None:
        """Stop the request threads (answers still out are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # --- the env worker's side: answers into the rollout buffer ----------------------------------

    def place(
        self,
        current: Any,
        earlier: list[Any],
        t: int,
        episode_info: dict[str, Any] | None,
        dones: Any,
        last: bool,
        settle: Callable[[DeferredEpisode], None],
    ) -> int:
        """Every answered episode whose value no longer stands, into the worker's rewards (`current`:
        the chunk that ended at step t - 1, `earlier`: the chunks before it) and into the records
        it read; at the epoch's `last` chunk step after waiting for every answer. `settle` gets
        each placed episode whose env has not started another (its values for episode_info).
        Returns how many reward entries were changed."""
        self.last_place_t = t
        if episode_info:
            self._keep_record(episode_info, dones, t)
        self._collect(wait=last)
        if last:  # the epoch ends: every value stood until here
            for episode in self.open.values():
                episode.close_t = t - 1
            self.open.clear()
        placed = self._place_answered(current, earlier, t, settle)
        if last:
            if self.records and self.records[-1].last_t == t - 1:  # read at this very step
                self._refresh_windows(self.records[-1])
            self.records.clear()
        return placed

    def _collect(self, wait: bool) -> None:
        """Settle the batches whose answers have come (wait: all of them, each bounded by the
        client's deadline, after which it is a failed request)."""
        config = self.judge.config
        still: list[InFlight] = []
        for flight in self.inflight:
            if not (wait or flight.future.done()):
                still.append(flight)
                continue
            # the client ends by deadline_s of its call; the grace covers the call starting after `started`
            bound = flight.batch.started + config.deadline_s + 10.0 - time.perf_counter()
            try:
                items, error = flight.future.result(timeout=max(bound, 0.0))
            except FutureTimeout:
                flight.batch.finished = time.perf_counter()
                why = f"no answer within deadline_s={config.deadline_s:g} s of submission"
                items, error = None, RewardClientError(why)
            for episode, outcome in zip(flight.episodes, self.judge.outcomes(flight.batch, items, error), strict=True):
                episode.outcome = outcome
        self.inflight = still

    def _place_answered(
        self, current: Any, earlier: list[Any], t: int, settle: Callable[[DeferredEpisode], None]
    ) -> int:
        per_chunk = int(current.shape[1])
        ready = [e for e in self.deferred if e.outcome is not None and e.close_t is not None]
        targets = []
        for episode in ready:  # locate everything first: nothing is changed if one step cannot be placed
            for step, amount, _ in episode.deltas(self.reward_coef, self.rel):
                if amount != 0.0:
                    back, slot = locate(step, t, per_chunk, earlier)
                    targets.append((current if back == 0 else earlier[-back], episode.env, slot, amount))
        for rewards, env, slot, amount in targets:
            add(rewards, env, slot, amount)
        for episode in ready:
            self.deferred.remove(episode)
            self._correct_records(episode)
            if self.open.get(episode.env) is None:
                settle(episode)
        return len(targets)

    def _keep_record(self, info: dict[str, Any], dones: Any, t: int) -> None:
        rows_total = len(next(iter(info.values())))
        if rows_total == self.num_envs:
            rows = {env: env for env in range(self.num_envs)}
        else:  # auto reset: RLinf keeps the rows of the envs done at the chunk's last step
            done = np.asarray(dones.cpu() if hasattr(dones, "cpu") else dones, dtype=bool).reshape(self.num_envs, -1)
            rows = {int(env): row for row, env in enumerate(np.flatnonzero(done[:, -1]))}
        self.records.append(Record(t - 1, info, rows))

    def _correct_records(self, episode: DeferredEpisode) -> None:
        """What the env would have logged for this episode, in each record read while it stood."""
        outcome, env = episode.outcome, episode.env
        for record in self.records:
            row = record.rows.get(env)
            if row is None or not episode.end_t <= record.last_t <= episode.close_t:
                continue
            info = record.info
            gained = sum(
                amount
                for step, amount, counted in episode.deltas(self.reward_coef, self.rel)
                if counted and step <= record.last_t
            )
            if "return" in info:
                add(info["return"], row, None, gained)
            if "reward" in info and gained:
                add(info["reward"], row, None, gained / self._reward_len(episode, record.last_t))
            for key, value in (
                ("vlm_score", outcome.score),
                ("vlm_fallback", float(outcome.fallback)),
                ("vlm_latency_ms", outcome.latency_ms),
                ("vlm_moved_reward", -outcome.moves[-1][1] if outcome.moves else 0.0),
            ):
                if key in info:
                    info[key][row] = value

    def _reward_len(self, episode: DeferredEpisode, last_t: int) -> float:
        """The divisor of the env's `reward` metric (return per step) at step last_t."""
        elapsed = last_t - episode.start_t + 1
        if self.returns.reward_len_at_success and 0 <= episode.success_t <= last_t:
            elapsed = episode.success_t - episode.start_t + 1
        return float(max(elapsed, 1))

    def _refresh_windows(self, record: Record) -> None:
        """The epoch's audit and canary aggregates, now that every answer is in, in the last record."""
        like = next(iter(record.info.values()))
        for key, value in self.judge.scalars().items():
            record.info[key] = full_like(like, len(like), value)


__all__ = [
    "LIBERO_RETURNS",
    "MANISKILL_RETURNS",
    "UNPLACED_STEPS_LIMIT",
    "DeferredEpisode",
    "DeferredRewards",
    "InFlight",
    "Record",
    "ReturnRule",
    "add",
    "full_like",
    "locate",
]
