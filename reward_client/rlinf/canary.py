"""Canary probes: counterfactual versions of real episodes that a sound judge must score low.

- `static`: the episode's first frame repeated (no motion at all). A judge that still sees
  progress reads the prompt, not the video (TOPReward's static-frame sweep found exactly this).
- `reversed`: the episode's frames in reverse order; it ends where the real episode began.
- `wrong_task`: the real frames with another task's instruction.

An episode filmed by several cameras (named views) gets probes of the same views, each changed
alike (every camera's first frame, every camera reversed), so its probes are judged as it is.
Each probe is scored in the same batch as the real episodes, and its score is only logged: it
never enters a reward. Used by the RLinf hook (a fraction of the episodes it sends) and by the
offline evaluation tool (python -m reward_tools.evaluate). numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Frames = np.ndarray | Mapping[str, np.ndarray]  # one episode's frames [T, H, W, 3], or each named view's

CanaryKind = Literal["static", "reversed", "wrong_task"]
CANARY_KINDS: tuple[CanaryKind, ...] = ("static", "reversed", "wrong_task")
# the probes that test motion: with progress curves on, they are judged as curves too, and a curve
# that rises on them (VOC > 0) comes from a judge that reads the prompt, not the video
CURVE_CANARIES: frozenset[CanaryKind] = frozenset({"static", "reversed"})
REQUEST_ID_PREFIX = "canary"


def _each_view(frames: Frames, change: Callable[[np.ndarray], np.ndarray]) -> Frames:
    if isinstance(frames, Mapping):
        return {name: change(view) for name, view in frames.items()}
    return change(frames)


def _static(frames: np.ndarray) -> np.ndarray:
    frames = np.asarray(frames)
    return np.repeat(frames[:1], len(frames), axis=0)


def static_frames(frames: Frames) -> Frames:
    """The first frame, as many times as the episode has frames (of each view)."""
    return _each_view(frames, _static)


def reversed_frames(frames: Frames) -> Frames:
    """The frames in reverse order (of each view)."""
    return _each_view(frames, lambda view: np.ascontiguousarray(np.asarray(view)[::-1]))


def other_task(task: str, pool: Iterable[str], rng: np.random.Generator) -> str | None:
    """An instruction from pool that differs from task; None when the pool holds no other."""
    candidates = sorted({t for t in pool if t.strip() and t.strip() != task.strip()})
    return candidates[int(rng.integers(len(candidates)))] if candidates else None


def request_id(kind: str, source: int) -> str:
    """Marks a probe on the wire (the server echoes it), e.g. in server logs."""
    return f"{REQUEST_ID_PREFIX}-{kind}-{source}"


@dataclass(frozen=True)
class Probe:
    kind: CanaryKind
    source: int  # the real episode it was made from (env index, or manifest row)
    frames: Frames  # as the real episode's: frames, or the same named views
    task: str

    @property
    def request_id(self) -> str:
        return request_id(self.kind, self.source)


def make_probes(
    source: int,
    frames: Frames,
    task: str,
    kinds: Sequence[CanaryKind],
    task_pool: Iterable[str],
    rng: np.random.Generator,
) -> tuple[list[Probe], list[CanaryKind]]:
    """(probes made from one episode, kinds that could not be made: wrong_task without another task)."""
    probes, skipped = [], []
    for kind in kinds:
        if kind == "static":
            probes.append(Probe(kind, source, static_frames(frames), task))
        elif kind == "reversed":
            probes.append(Probe(kind, source, reversed_frames(frames), task))
        elif kind == "wrong_task":
            other = other_task(task, task_pool, rng)
            if other is None:
                skipped.append(kind)
            else:
                probes.append(Probe(kind, source, frames, other))
        else:
            raise ValueError(f"unknown canary kind {kind!r}; choose from {', '.join(CANARY_KINDS)}")
    return probes, skipped


class CanarySelector:
    """Picks which episodes of each batch get probes, so that over a run the fraction probed is
    `fraction` and every batch carries its share (no batch with many probes, then none): the
    fractional remainder carries over to the next batch. Which episodes of a batch is random."""

    def __init__(self, fraction: float, seed: int = 0):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"canary fraction must be in [0, 1], got {fraction}")
        self.fraction = fraction
        self.rng = np.random.default_rng(seed)
        self._credit = 0.0

    def select(self, count: int) -> np.ndarray:
        """Positions in [0, count) to probe, ascending."""
        self._credit += self.fraction * count
        take = min(count, int(self._credit + 1e-9))  # 1e-9: 0.1 * 10 must give 1, not 0.999...
        self._credit -= take
        return np.sort(self.rng.choice(count, size=take, replace=False)) if take else np.zeros(0, dtype=int)


class CanaryPlanner:
    """The probes for one batch of ending episodes: the selected share of them, every kind each,
    wrong_task instructions drawn from every task seen so far plus `extra_tasks`."""

    def __init__(
        self,
        fraction: float,
        kinds: Sequence[CanaryKind] = CANARY_KINDS,
        extra_tasks: Sequence[str] = (),
        seed: int = 0,
    ):
        self.kinds = tuple(kinds)
        self.selector = CanarySelector(fraction, seed)
        self.task_pool: dict[str, None] = dict.fromkeys(extra_tasks)  # an ordered set
        self.skipped = 0  # probes that could not be made (wrong_task with no other task known)

    def plan(self, sources: Sequence[int], tasks: Sequence[str], frames: Sequence[Frames], room: int) -> list[Probe]:
        """Probes for the selected share of the episodes sources[i] (task tasks[i], frames
        frames[i]); at most `room`."""
        self.task_pool.update(dict.fromkeys(tasks))
        chosen = self.selector.select(len(sources))
        return self.probes_for(
            [sources[i] for i in chosen], [tasks[i] for i in chosen], [frames[i] for i in chosen], room
        )

    def probes_for(
        self, sources: Sequence[int], tasks: Sequence[str], frames: Sequence[Frames], room: int
    ) -> list[Probe]:
        """Every kind of probe for each of these episodes; at most `room`."""
        self.task_pool.update(dict.fromkeys(tasks))
        probes: list[Probe] = []
        for source, task, episode in zip(sources, tasks, frames, strict=True):
            made, skipped = make_probes(int(source), episode, task, self.kinds, self.task_pool, self.selector.rng)
            probes += made
            self.skipped += len(skipped)
        if len(probes) > room:
            self.skipped += len(probes) - room
            probes = probes[: max(room, 0)]
        return probes
