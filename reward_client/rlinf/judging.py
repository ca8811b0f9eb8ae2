"""Ended episodes to one batch request, and its answer (or its failure) to each episode's outcome.

The judge of the RLinf hook, without steps or envs' timing: it builds the request for the
episodes that ended together (with the canary probes of some of them, reward_client.rlinf.canary),
sends it (raw batch, inline JSON or video paths), and turns what came back into an `Outcome`
per episode: the score and the value that stands for it in RLinf's reward (binary threshold or
not), the fallback when there is no score, and, for a progress curve, where its reward was
earned (reward_client.rlinf.dense). It also keeps what is only measured: the counts, the audit
against the env's success flag (reward_client.rlinf.audit) and the canary tallies. When the request
runs (now, or on a thread: async judging) and where the outcome goes is the hook's
(reward_client.rlinf.hook) and the async ledger's (reward_client.rlinf.deferred).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reward_client.client import RetryPolicy, RewardClient, RewardClientError, RewardRequestError
from reward_client.rlinf.audit import CanaryTally, JudgeAudit, task_key
from reward_client.rlinf.canary import CURVE_CANARIES, CanaryPlanner, Probe
from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.dense import Move, model_frame_count, moves, point_frames
from reward_client.rlinf.views import View
from reward_protocol.frames import FrameSpec, to_grid
from reward_protocol.raw_batch import Video
from reward_protocol.score import (
    MAX_BATCH_ITEMS,
    BackendKwargs,
    InlineFrames,
    ScoreOptions,
    ScoreRequest,
    ViewFrames,
    check_view_layout,
)

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What the judge (or the fallback) made of one episode."""

    score: float
    value: float
    fallback: bool
    latency_ms: float
    curve: list[float | None] | None = None
    moves: list[Move] = field(default_factory=list)  # episode action index -> reward moved there


@dataclass(frozen=True)
class Ended:
    """One ended episode as the hook recorded it."""

    env: int
    task: str
    task_id: Any
    frames: np.ndarray  # [T, H, W, 3] uint8, picked over the whole episode
    success: bool  # the env's success flag at the done step (the `env_success` fallback)
    success_so_far: bool  # success at any step of the episode (what the audit compares with)
    steps: list[int]  # frame steps sent (for a curve's moves)
    length: int  # frames recorded (actions + the reset frame)
    views: list[View] = field(default_factory=list)  # several cameras: (label, frames) each, `frames` first
    error: str | None = None  # why the episode cannot be judged as recorded (a camera changed mid-episode)


@dataclass
class Batch:
    """One batch request: the ended episodes (and canary probes) as sent, and what is needed to
    turn the answer into outcomes whenever it comes."""

    ended: list[Ended]
    probes: list[Probe]
    episodes: list[tuple[ScoreOptions, Video]]  # the ended episodes sent (all but `unsent`), then the probes
    paths: list[str | None]  # files written for the request, deleted after it
    started: float
    finished: float = 0.0
    unsent: dict[int, str] = field(default_factory=dict)  # position in `ended` -> why it was not sent

    @property
    def real(self) -> int:
        """How many of `episodes` are ended episodes (the rest are canary probes)."""
        return len(self.ended) - len(self.unsent)


class EpisodeJudge:
    """Requests and outcomes for one hook (one RLinf env object)."""

    def __init__(
        self, config: RewardModelConfig, client: RewardClient | None, reward_coef: float, spec: FrameSpec, dense: bool
    ):
        self.config = config
        self.reward_coef = reward_coef
        self.spec = spec  # the frame layout the server follows (pairs for Qwen2.5-VL)
        self.dense = dense  # curves become reward moves (progress_points > 1 under use_rel_reward)
        self.client = client or RewardClient(
            config.url,
            RetryPolicy(deadline_s=config.deadline_s, timeout_s=config.timeout_s),
            api_key=config.api_key,
        )
        self.audit = JudgeAudit(config.success_threshold) if config.audit else None
        self.canaries = CanaryTally(config.canary_kinds) if config.canary_fraction > 0 else None
        self.planner = CanaryPlanner(config.canary_fraction, config.canary_kinds, config.canary_tasks)
        self.counts = {
            "episodes": 0,
            "scored": 0,
            "fallbacks": 0,
            "parse_failures": 0,
            "request_errors": 0,
            "batches": 0,
            "canaries": 0,
            "canary_failures": 0,
            "view_errors": 0,  # episodes not sent: their cameras cannot make one request (fallbacks too)
        }
        self._video_dir = config.video_dir or os.path.join(tempfile.gettempdir(), "rlinf_vlm_episodes")
        if config.transport == "video_path" or config.keep_videos:
            os.makedirs(self._video_dir, exist_ok=True)

    def wait_for_server(self) -> None:
        if self.config.wait_ready_s <= 0:
            return
        try:
            health = self.client.wait_until_ready(self.config.wait_ready_s)
            logger.info("VLM reward server ready: %s (%s on %s)", self.config.url, health.backend, health.engine)
        except RewardClientError as exc:
            if self.config.fail_on_request_error:
                raise RuntimeError(
                    f"VLM reward: {exc}. Start the reward server first (python -m reward_server ...), or set "
                    "env.train.reward_model.fail_on_request_error: False to train on the counted fallback"
                ) from exc
            logger.warning(
                "VLM reward server not ready (%s); episodes will use the '%s' fallback until it is",
                exc,
                self.config.fallback,
            )

    # --- the request ----------------------------------------------------------------------------

    def batch(self, ended: list[Ended], all_tasks: Sequence[str]) -> Batch:
        """The request for episodes that ended together (all_tasks: every env's instruction, the
        pool wrong_task probes draw from). An episode whose cameras cannot make a request (one
        changed mid-episode, views a request cannot carry) is not sent: it stops the run, or with
        fail_on_request_error False it is a counted fallback, and the others are judged."""
        started = time.perf_counter()
        unsent = {i: why for i, e in enumerate(ended) if (why := _view_error(e)) is not None}
        self.counts["episodes"] += len(ended)
        self.counts["view_errors"] += len(unsent)
        if unsent and self.config.fail_on_request_error:
            i, why = next(iter(unsent.items()))
            raise RuntimeError(
                f"VLM reward: {len(unsent)} of {len(ended)} ended episodes cannot be judged as recorded (env "
                f"{ended[i].env}: {why}). Fix the env's camera frames (env.train.reward_model.views), or set "
                f"env.train.reward_model.fail_on_request_error: False to use the '{self.config.fallback}' fallback "
                "instead (counted in env/vlm_fallback)"
            )
        sent = [e for i, e in enumerate(ended) if i not in unsent]
        # several cameras go as named views, and so do the canary probes made of them
        videos = [{name: self._fit(f) for name, f in e.views} if e.views else self._fit(e.frames) for e in sent]
        envs, texts = [e.env for e in sent], [e.task for e in sent]
        self.planner.task_pool.update(dict.fromkeys(map(str, all_tasks)))
        probes = [] if self.canaries is None else self.planner.plan(envs, texts, videos, MAX_BATCH_ITEMS - len(envs))
        built = [self._episode(e, t, v) for e, t, v in zip(envs, texts, videos, strict=True)]
        # static and reversed probes get a curve too: one that rises on them shows a judge blind to motion
        built += [self._episode(p.source, p.task, p.frames, p.request_id, p.kind in CURVE_CANARIES) for p in probes]
        self.counts["batches"] += 1
        self.counts["canaries"] += len(probes)
        return Batch(
            ended=ended,
            probes=probes,
            episodes=[(options, video) for options, video, _ in built],
            paths=[path for _, _, path in built],
            started=started,
            unsent=unsent,
        )

    def call(self, batch: Batch) -> tuple[list | None, RewardClientError | None]:
        """The request; in async mode on a request thread, touching no state but the client's."""
        try:
            return self._score_batch(batch.episodes, batch.real), None
        except RewardClientError as exc:
            return None, exc
        finally:
            self._cleanup(batch.paths)
            batch.finished = time.perf_counter()

    def _fit(self, frames: np.ndarray) -> np.ndarray:
        """to_grid: frames resized onto the model's grid here, so the server resizes nothing."""
        return to_grid(frames, max_pixels=self.config.max_pixels) if self.config.to_grid else frames

    def _episode(
        self, env: int, task: str, video: Video, tag: str | None = None, curve: bool = True
    ) -> tuple[ScoreOptions, Video, str | None]:
        """(options, frames, named views or video path, file to delete afterwards) for one episode or probe."""
        frames = next(iter(video.values())) if isinstance(video, dict) else video
        points = 1
        if curve and self.config.progress_points > 1:
            points = min(self.config.progress_points, model_frame_count(self.spec, self.config.nframes, len(frames)))
        options = ScoreOptions(
            request_id=tag,  # None for real episodes; canary probes are marked
            task_text=task,
            nframes=self.config.nframes,
            max_pixels=self.config.max_pixels,
            backend=self.config.backend,
            backend_kwargs=BackendKwargs(score_mode=self.config.score_mode),
            progress_points=points,
        )
        if self.config.transport == "video_path" or (self.config.keep_videos and tag is None):
            from reward_client.video_io import write_mp4

            path = os.path.join(self._video_dir, f"{uuid.uuid4().hex}_env{env}{'_' + tag if tag else ''}.mp4")
            write_mp4(frames, path)  # several views: the first (keep_videos)
            if self.config.transport == "video_path":
                return options, path, path
        return options, video, None

    def _send(self, episodes: list[tuple[ScoreOptions, Video]]) -> list:
        if self.config.transport == "inline":
            return self.client.score_batch([_inline(options, video) for options, video in episodes])
        return self.client.score_episodes(episodes)

    def _score_batch(self, episodes: list[tuple[ScoreOptions, Video]], real: int) -> list:
        """If the server refuses the request as sent (4xx, e.g. a body limit that the canary
        probes pushed it over), the real episodes go again without them."""
        try:
            return self._send(episodes)
        except RewardRequestError as exc:
            if real == len(episodes):
                raise
            logger.warning("VLM canary: request refused with its probes (%s); resending the episodes alone", exc)
            return [*self._send(episodes[:real]), *[None] * (len(episodes) - real)]

    def _cleanup(self, paths: Sequence[str | None]) -> None:
        if self.config.keep_videos:
            return
        for path in paths:
            if path:
                try:
                    os.remove(path)
                except OSError:
                    pass

    # --- the answer -----------------------------------------------------------------------------

    def outcomes(self, batch: Batch, items: list | None, error: RewardClientError | None) -> list[Outcome]:
        """Each ended episode's outcome from the batch's answer (or its failure), with the counts,
        fallbacks, audit and canary tallies; raises when a failure must stop the run."""
        n, real = len(batch.ended), batch.real
        if error is not None:
            self.counts["request_errors"] += 1
            if self.config.fail_on_request_error:
                raise RuntimeError(
                    f"VLM reward request for {real} episodes failed: {error}. Set "
                    f"env.train.reward_model.fail_on_request_error: False to use the '{self.config.fallback}' "
                    "fallback instead (counted in env/vlm_fallback)"
                ) from error
            logger.warning(
                "VLM reward request failed (%s); %d episodes use the '%s' fallback", error, real, self.config.fallback
            )
            items = [None] * len(batch.episodes)
        answers = iter(items[:real])  # each ended episode's answer, None for those not sent
        mine = [None if i in batch.unsent else next(answers) for i in range(n)]
        refused = [
            (e.env, item.error)
            for e, item in zip(batch.ended, mine, strict=True)
            if item is not None and item.error is not None
        ]
        if refused:
            # the server answered, but not for these episodes (a wrong option, a deadline): a
            # request error like any other, not a model output to fall back from silently
            self.counts["request_errors"] += 1
            env, err = refused[0]
            if self.config.fail_on_request_error:
                raise RuntimeError(
                    f"VLM reward server refused {len(refused)} of {n} episodes (env {env}: "
                    f"{err.type}: {err.message}). Fix the reward_model settings, or set "
                    f"env.train.reward_model.fail_on_request_error: False to use the '{self.config.fallback}' "
                    "fallback instead (counted in env/vlm_fallback)"
                )
        elapsed_ms = (batch.finished - batch.started) * 1000
        for probe, item in zip(batch.probes, items[real:], strict=True):  # logged only; a failure is counted
            answer = item.response if item is not None else None
            score = answer.score if answer is not None else None
            self.counts["canary_failures"] += score is None
            self.canaries.record_probe(probe.kind, score, answer.progress if answer is not None else None)
            if score is None and item is not None:  # a request that failed was logged once, above
                why = item.error or item.response.parse_status.value
                logger.warning("VLM canary %s has no score (%s); no reward depends on it", probe.request_id, why)
        out = [
            self._outcome(e, item, elapsed_ms, batch.unsent.get(i))
            for i, (e, item) in enumerate(zip(batch.ended, mine, strict=True))
        ]
        logger.info("VLM reward: judged %d episodes in %.0f ms (totals %s)", n, elapsed_ms, self.counts)
        return out

    def _outcome(self, ended: Ended, item: Any, elapsed_ms: float, unsent: str | None = None) -> Outcome:
        score = item.response.score if item is not None and item.response is not None else None
        if score is None:
            reason = (
                f"not sent: {unsent}"
                if unsent is not None
                else "request failed"
                if item is None
                else f"{item.error.type}: {item.error.message}"
                if item.error is not None
                else f"parse {item.response.parse_status.value}: {item.response.parse_error}"
            )
            if item is not None and item.response is not None:
                self.counts["parse_failures"] += 1
            return Outcome(0.0, self._fall_back(ended.env, ended.success, reason), True, elapsed_ms)
        self.counts["scored"] += 1
        curve = item.response.progress
        outcome = Outcome(score, self.value(score), False, elapsed_ms, curve)
        self._measure(ended, score, curve)
        if curve is not None and self.dense:
            outcome.moves = self._plan_moves(ended.steps, ended.length, curve)
        return outcome

    def value(self, score: float) -> float:
        """The value that stands for a score in RLinf's reward."""
        if self.config.binary_reward:
            return 1.0 if score >= self.config.success_threshold else 0.0
        return float(score)

    def _measure(self, ended: Ended, score: float, curve: list[float | None] | None) -> None:
        """The judged episode against the env's success flag (fallback episodes were not judged): logged only."""
        if self.audit is not None:
            self.audit.record(task_key(ended.task_id, ended.task), ended.task, score, ended.success_so_far, curve)
        if self.canaries is not None:
            self.canaries.record_real(score, ended.success_so_far)

    def _plan_moves(self, steps: list[int], length: int, curve: list[float | None]) -> list[Move]:
        """Where this episode's terminal reward was earned, by its curve (reward_client.rlinf.dense)."""
        values = [None if v is None else self.value(v) for v in curve]
        frame_steps = point_frames(steps, self.config.nframes, len(curve), self.spec)
        done_action = max(length - 2, 0)  # frames = actions + the reset frame
        return moves(frame_steps, values, done_action, self.reward_coef)

    def _fall_back(self, env: int, env_success: bool, reason: str) -> float:
        value = float(env_success) if self.config.fallback == "env_success" else 0.0
        self.counts["fallbacks"] += 1
        logger.warning(
            "VLM reward: env %d has no score (%s); fallback '%s' = %g", env, reason, self.config.fallback, value
        )
        return value

    # --- the measured windows (one rollout epoch) -----------------------------------------------

    def new_window(self) -> None:
        for window in (self.audit, self.canaries):
            if window is not None:
                window.new_window()

    def scalars(self) -> dict[str, float]:
        """This window's audit and canary aggregates (env/vlm_audit/*, env/vlm_canary/*)."""
        out: dict[str, float] = {}
        for window in (self.audit, self.canaries):
            out.update(window.scalars() if window else {})
        return out


def _view_error(ended: Ended) -> str | None:
    """Why this episode cannot go as one request (its cameras), or None: the protocol's own check
    of several views, made here so that one episode is refused, not its whole batch."""
    if ended.error is not None:
        return ended.error
    if not ended.views:
        return None
    try:
        check_view_layout([name for name, _ in ended.views], [len(f) for _, f in ended.views])
    except ValueError as exc:
        return f"its views cannot make a request: {exc}"
    return None


def _inline(options: ScoreOptions, video: Video) -> ScoreRequest:
    """The JSON form of one episode: base64 frames, or base64 named views."""
    if isinstance(video, dict):
        views = [ViewFrames(name=name, frames=InlineFrames.from_array(f)) for name, f in video.items()]
        return ScoreRequest(**options.model_dump(), views=views)
    return ScoreRequest(**options.model_dump(), frames=InlineFrames.from_array(video))


__all__ = ["Batch", "Ended", "EpisodeJudge", "Outcome"]
