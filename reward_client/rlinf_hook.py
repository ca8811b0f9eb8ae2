"""The VLM reward inside RLinf's envs (called by the patched `libero_env.py` and `maniskill_env.py`).

The hook sees every env of one RLinf env object through a per-step view (`EnvStep`:
frames, instructions, termination, truncation and success flags); what differs between envs
(where the frames are, which flag means success, where the instruction comes from) is in
reward_client.env_adapters. `start` / `step` are the env-neutral entry points; `on_reset` /
`on_step` are the LIBERO patch's.

For LIBERO, RLinf computes `reward = step_penalty + reward_coef * termination` (and, under
`use_rel_reward`, the difference to the previous step). The patch hands `_calc_step_reward`
the value of this hook instead of the termination flags: 0 until an env's episode first ends,
then the judge's score (or its binary threshold) for the rest of the episode. RLinf's own
arithmetic then gives `reward_coef * score` once, at the first done step, under
`use_rel_reward`; envs that keep stepping after done are not scored again.

With `progress_points: K > 1` the judge returns a progress curve, and under `use_rel_reward` the
hook also works out where the terminal reward was earned: each point's gain times reward_coef
belongs to the action whose frame ends that point's prefix (reward_client.dense). The env still
hands RLinf the terminal reward; RLinf's env worker (rlinf_patches/env_worker.patch) then moves
those parts back to their steps in its rollout buffer (`place_rewards`), so the rewards the actor
trains on are dense and still sum to `reward_coef * score`. Without `use_rel_reward`, a curve
changes no reward.

All envs that end in the same step are judged in one batch request, with the canary probes of
some of them (reward_client.canary); the judge is audited against the env's own success flag
(reward_client.audit). Neither touches a reward.

With `async: True` the judge is off the rollout's critical path: an episode's end submits its
batch and the step returns at once (the ended episode's value stays 0 in the env); the judged
reward is added to RLinf's rollout buffer at the episode's own done step when the answer has
come (reward_client.deferred), and the env worker waits for what is still out only at the
rollout epoch's last chunk step (rlinf_patches/env_worker.patch), bounded by `deadline_s`.
Rewards, their sum per episode and the logged `env/return` are those of the synchronous mode.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from reward_client.audit import CanaryTally, JudgeAudit, task_key
from reward_client.canary import CANARY_KINDS, CURVE_CANARIES, CanaryKind, CanaryPlanner
from reward_client.client import RetryPolicy, RewardClient, RewardClientError, RewardRequestError
from reward_client.deferred import (
    LIBERO_RETURNS,
    DeferredEpisode,
    Outcome,
    Record,
    ReturnRule,
    add,
    full_like,
    locate,
)
from reward_client.dense import Move, model_frame_count, moves, place, point_frames
from reward_client.env_adapters import EnvStep, LiberoAdapter
from reward_client.episodes import EpisodeBuffers
from reward_client.frames import to_grid
from reward_client.protocol import MAX_BATCH_ITEMS, BackendKwargs, InlineFrames, ScoreMode, ScoreOptions, ScoreRequest

logger = logging.getLogger(__name__)


class RewardModelConfig(BaseModel):
    """`env.train.reward_model` in an RLinf run config."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    enable: bool = False
    async_: bool = Field(
        False,
        alias="async",
        description="judge off the rollout's critical path: submit at an episode's end, place the reward in "
        "RLinf's rollout buffer when it comes, wait only at the rollout epoch's end (needs "
        "rlinf_patches/env_worker.patch; without it no judged reward reaches the actor)",
    )
    async_batches: int = Field(4, ge=1, le=64, description="async: batch requests in flight at once")
    url: str | list[str] = Field(
        "http://127.0.0.1:18080", description="one server, or a list of replicas (round-robin, failover, split batches)"
    )
    backend: str | None = Field(None, description="checked by the server when given")
    nframes: int = Field(16, ge=1, le=256)
    max_pixels: int = 256 * 28 * 28
    to_grid: bool = Field(
        False,
        description="resize frames onto the model's 28-pixel grid in the env worker (256x256 -> 252x252, as the "
        "server would), so the server resizes nothing",
    )
    score_mode: ScoreMode | None = None
    transport: Literal["raw", "inline", "video_path"] = Field(
        "raw",
        description="raw: frames as bytes in one raw batch body (fastest); inline: base64 frames in JSON; "
        "video_path: an MP4 in video_dir (a filesystem the server also sees)",
    )
    video_dir: str | None = Field(None, description="for transport video_path; default: <tmp>/rlinf_vlm_episodes")
    keep_videos: bool = Field(False, description="also write each judged episode's frames as an MP4 in video_dir")
    binary_reward: bool = False
    success_threshold: float = Field(0.5, ge=0.0, le=1.0)
    score_on_truncation: bool = True
    fail_on_request_error: bool = True
    fallback: Literal["zero", "env_success"] = Field(
        "zero", description="reward value when no score can be had and fail_on_request_error is False"
    )
    timeout_s: float = Field(300.0, gt=0)
    deadline_s: float = Field(900.0, gt=0)
    wait_ready_s: float = Field(600.0, ge=0)
    api_key: str | None = None
    task_text: str | None = Field(
        None, description="instruction for envs whose task has none of its own (ManiSkill's PickCube, ...)"
    )
    audit: bool = Field(True, description="log env/vlm_audit/*: the judge against the env's own success flag")
    canary_fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of episodes also sent as canary probes")
    canary_kinds: list[CanaryKind] = Field(default_factory=lambda: list(CANARY_KINDS))
    canary_tasks: list[str] = Field(default_factory=list, description="wrong_task instructions besides the envs' tasks")
    progress_points: int = Field(
        1,
        ge=1,
        le=256,
        description="K > 1: ask for a progress curve of K points (at most the frames sent); under use_rel_reward "
        "each point's gain is placed at the step where its prefix ends (needs rlinf_patches/env_worker.patch)",
    )


# An env worker places what the judge said after every chunk step; this many steps without a
# placement while answers are owed means RLinf's env worker is not patched.
UNPLACED_STEPS_LIMIT = 4096


@dataclass
class _Batch:
    """One batch request: the ended episodes (and canary probes) as sent, and what is needed to
    turn the answer into rewards whenever it comes."""

    envs: np.ndarray
    tasks: list[str]
    task_ids: list[Any]
    success: list[bool]  # the env's success flag at the done step (the `env_success` fallback)
    success_so_far: list[bool]  # success at any step of the episode (what the audit compares with)
    steps: list[list[int]]  # frame steps sent, per episode (for a curve's moves)
    lengths: list[int]
    probes: list
    episodes: list[tuple[ScoreOptions, np.ndarray | str]]
    paths: list[str | None]
    started: float
    finished: float = 0.0
    deferred: list[DeferredEpisode] = field(default_factory=list)  # async mode
    future: Future | None = None


class VLMRewardHook:
    def __init__(
        self,
        config: RewardModelConfig,
        num_envs: int,
        ignore_terminations: bool = False,
        client: RewardClient | None = None,
        reward_coef: float = 1.0,
        use_rel_reward: bool = False,
        auto_reset: bool = False,
        returns: ReturnRule = LIBERO_RETURNS,
    ):
        self.config = config
        self.num_envs = num_envs
        self.ignore_terminations = ignore_terminations
        self.reward_coef = reward_coef
        self.use_rel_reward = use_rel_reward
        self.auto_reset = auto_reset
        self.returns = returns
        # a curve places rewards only where RLinf rewards the change of the hook's value (the
        # success bonus appears once): without use_rel_reward it would stand at every later step
        self.dense = config.progress_points > 1 and use_rel_reward
        if self.dense and auto_reset:
            raise ValueError(
                "env.train.reward_model.progress_points > 1 places rewards within an episode, which needs episodes "
                "that start with the rollout epoch: set env.train.auto_reset: False, or progress_points: 1"
            )
        self.pending: dict[int, list[Move]] = {}  # env -> reward moves not yet placed by the env worker
        self.curves: dict[int, list[float | None]] = {}  # env -> its episode's progress curve, once judged
        self.moved = np.zeros(num_envs, dtype=np.float64)  # reward moved back from each env's done step
        self.placed = 0  # rewards placed in RLinf's rollout buffer so far
        self._unplaced_warned = False
        self.buffers = EpisodeBuffers(num_envs, config.nframes)
        self.spec = self.buffers.spec  # the frame layout the server follows (pairs for Qwen2.5-VL)
        self.client = client or RewardClient(
            config.url,
            RetryPolicy(deadline_s=config.deadline_s, timeout_s=config.timeout_s),
            api_key=config.api_key,
        )
        self.judged = np.zeros(num_envs, dtype=bool)
        self.values = np.zeros(num_envs, dtype=np.float64)
        self.scores = np.zeros(num_envs, dtype=np.float64)
        self.fallback = np.zeros(num_envs, dtype=np.float64)
        self.latency_ms = np.zeros(num_envs, dtype=np.float64)
        self.env_success = np.zeros(num_envs, dtype=bool)  # the env's flag so far: measured against, never a reward
        self.audit = JudgeAudit(config.success_threshold) if config.audit else None
        self.canaries = CanaryTally(config.canary_kinds) if config.canary_fraction > 0 else None
        self.planner = CanaryPlanner(config.canary_fraction, config.canary_kinds, config.canary_tasks)
        self._task_ids: Any = None
        self.counts = {
            "episodes": 0,
            "scored": 0,
            "fallbacks": 0,
            "parse_failures": 0,
            "request_errors": 0,
            "batches": 0,
            "canaries": 0,
            "canary_failures": 0,
        }
        # async mode: absolute steps (every env steps together), and what is owed to the buffer
        self.t = 0  # actions stepped by every env since the hook was built
        self.start_t = np.zeros(num_envs, dtype=np.int64)  # absolute index of each env's episode's first action
        self.success_t = np.full(num_envs, -1, dtype=np.int64)  # absolute step of the episode's first success
        self.inflight: list[_Batch] = []
        self.deferred: list[DeferredEpisode] = []  # ended, not yet placed
        self.open: dict[int, DeferredEpisode] = {}  # env -> its deferred episode, while the env has not reset
        self.records: list[Record] = []  # the epoch's infos["episode"] the env worker read
        self._last_place_t = 0
        self._pool: ThreadPoolExecutor | None = None
        self._video_dir = config.video_dir or os.path.join(tempfile.gettempdir(), "rlinf_vlm_episodes")
        if config.transport == "video_path" or config.keep_videos:
            os.makedirs(self._video_dir, exist_ok=True)
        self._wait_for_server()

    @property
    def is_async(self) -> bool:
        return self.config.async_

    @classmethod
    def from_rlinf_config(cls, cfg: Any, num_envs: int, returns: ReturnRule = LIBERO_RETURNS) -> VLMRewardHook:
        """Build from RLinf's env config (an OmegaConf node holding `reward_model`)."""
        raw = cfg.reward_model
        try:
            from omegaconf import OmegaConf

            raw = OmegaConf.to_container(raw, resolve=True)
        except ImportError:
            raw = dict(raw)
        return cls(
            RewardModelConfig.model_validate(raw),
            num_envs,
            ignore_terminations=bool(cfg.ignore_terminations),
            reward_coef=float(cfg.get("reward_coef", 1.0)),
            use_rel_reward=bool(cfg.get("use_rel_reward", False)),
            auto_reset=bool(cfg.get("auto_reset", False)),
            returns=returns,
        )

    def _wait_for_server(self) -> None:
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

    # --- env-neutral entry points (reward_client.env_adapters builds the view) ------------------

    def start(self, env_idx: Any, frames: Any) -> None:
        """Episodes start for env_idx (None: every env); frames holds all envs' current frames."""
        ids = np.arange(self.num_envs) if env_idx is None else np.atleast_1d(np.asarray(env_idx, dtype=np.int64))
        new_epoch = len(ids) == self.num_envs  # every env restarts: a new rollout epoch
        if new_epoch and self.deferred and not self.auto_reset:
            raise RuntimeError(
                f"VLM reward (async): {len(self.deferred)} judged episodes of the last rollout epoch were never placed "
                "in RLinf's rollout buffer. Async judging needs rlinf_patches/env_worker.patch (bash "
                "scripts/apply_rlinf_patches.sh RLINF_DIR), or set env.train.reward_model.async: False"
            )
        frames = np.asarray(frames)
        self.buffers.start(ids, frames[ids])
        for arr in (self.values, self.scores, self.fallback, self.latency_ms, self.moved):
            arr[ids] = 0.0
        self.judged[ids] = False
        self.env_success[ids] = False
        self.start_t[ids] = self.t
        self.success_t[ids] = -1
        for env in map(int, ids):
            self.curves.pop(env, None)
            episode = self.open.pop(env, None)
            if episode is not None:  # its value stood until this reset (auto reset: the chunk's last step)
                episode.close_t = self.t - 1
        stale = [env for env in map(int, ids) if self.pending.pop(env, None)]
        if stale and not self._unplaced_warned:
            self._unplaced_warned = True
            logger.warning(
                "VLM reward: the progress-curve rewards of envs %s were never placed (is rlinf_patches/"
                "env_worker.patch applied?); their episodes kept the terminal reward",
                stale,
            )
        for window in (self.audit, self.canaries):
            if window is not None and new_epoch:
                window.new_window()

    def step(self, view: EnvStep) -> np.ndarray:
        """Record this step's frames, judge the episodes that just ended (all in one request);
        returns the per-env value that stands where the env's success signal stood in RLinf's
        reward: 0 until an episode first ends, then its score (async: 0 until the episode's
        reward is placed in the rollout buffer by the env worker)."""
        self.t += 1
        now = self.t - 1  # this step's absolute index
        running = ~self.judged
        self.env_success |= view.success & running
        # the env's return counts this step's reward unless it succeeded before (LIBERO)
        counted = (self.success_t < 0) if self.returns.stops_at_success else np.ones(self.num_envs, dtype=bool)
        self.success_t[view.success & (self.success_t < 0)] = now
        for env, episode in self.open.items():  # the value stands after the done step (sync)
            episode.tail.append((now, bool(counted[env])))
            episode.success_t = int(self.success_t[env])
        self._task_ids = view.task_ids
        self.buffers.append(view.frames, running)
        if self.ignore_terminations:
            ended = view.truncations
        elif self.config.score_on_truncation:
            ended = view.terminations | view.truncations
        else:
            ended = view.terminations
        new = np.flatnonzero(ended & running)
        if len(new):
            self._judge(new, view, counted)
        if self.is_async and self.deferred and self.t - self._last_place_t > UNPLACED_STEPS_LIMIT:
            raise RuntimeError(
                f"VLM reward (async): {self.t - self._last_place_t} steps without RLinf's env worker placing a "
                "judged reward. Async judging needs rlinf_patches/env_worker.patch, or set "
                "env.train.reward_model.async: False"
            )
        return self.values.copy()

    # --- called by the patched LiberoEnv -------------------------------------------------

    def on_reset(self, env_idx: Any, main_images: Any) -> None:
        """LIBERO's reset: see `start`."""
        self.start(env_idx, main_images)

    def on_step(
        self,
        main_images: Any,
        task_descriptions: Sequence[str],
        terminations: Any,
        truncations: Any,
        task_ids: Any = None,
    ) -> np.ndarray:
        """LIBERO's step: the value that replaces the termination flags in RLinf's reward. task_ids
        (LIBERO's) name the per-task audit scalars (else a slug of the task text does)."""
        return self.step(LiberoAdapter.view(main_images, task_descriptions, terminations, truncations, task_ids))

    # --- called by RLinf's env worker (rlinf_patches/env_worker.patch) -------------------------

    def place_rewards(
        self,
        current: Any,
        earlier: list[Any],
        chunk_index: int,
        episode_info: dict[str, Any] | None = None,
        dones: Any = None,
        last: bool = False,
    ) -> int:
        """Called by RLinf's env worker after each chunk step: put what the judge said where it
        belongs. `current` is the chunk just stepped ([num_envs, actions per chunk], chunk
        `chunk_index` of the rollout epoch), `earlier` the worker's rewards of the chunks before
        it. Sync mode: a progress curve's moves. Async mode: every episode whose answer has come
        (at the epoch's `last` chunk step: after waiting for all of them), with the env metrics
        the worker read (`episode_info`, rows per `dones` under auto reset) corrected in place.
        Returns how many reward entries were changed."""
        if not self.is_async:
            if not self.pending:
                return 0
            pending, self.pending = self.pending, {}
            placed = place(pending, current, earlier, chunk_index)
            self.placed += placed
            return placed
        self._last_place_t = self.t
        if episode_info:
            self._keep_record(episode_info, dones)
        self._collect(wait=last)
        if last:  # the epoch ends: every value stood until here
            for episode in self.open.values():
                episode.close_t = self.t - 1
            self.open.clear()
        placed = self._place_answered(current, earlier)
        if last:
            if self.records and self.records[-1].last_t == self.t - 1:  # read at this very step
                self._refresh_windows(self.records[-1])
            self.records.clear()
        self.placed += placed
        return placed

    def episode_info(self) -> dict[str, np.ndarray]:
        """Per-episode values for `infos["episode"]` (RLinf logs them as env/<key>), plus this rollout
        epoch's audit and canary aggregates in every env's slot (reward_client.audit says why)."""
        info = {
            "vlm_score": self.scores.copy(),
            "vlm_fallback": self.fallback.copy(),
            "vlm_latency_ms": self.latency_ms.copy(),
        }
        if self.dense:  # reward moved back from the done step to where the curve rose
            info["vlm_moved_reward"] = self.moved.copy()
        for window in (self.audit, self.canaries):
            info.update({k: np.full(self.num_envs, v) for k, v in (window.scalars() if window else {}).items()})
        return info

    def close(self) -> None:
        """Stop the async request threads (answers still out are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # --- judging ------------------------------------------------------------------------------

    def _episode(
        self, env: int, task: str, frames: np.ndarray, tag: str | None = None, curve: bool = True
    ) -> tuple[ScoreOptions, np.ndarray | str, str | None]:
        """(options, frames or video path, file to delete afterwards) for one episode or probe."""
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
            write_mp4(frames, path)
            if self.config.transport == "video_path":
                return options, path, path
        return options, frames, None

    def _send(self, episodes: list[tuple[ScoreOptions, np.ndarray | str]]) -> list:
        if self.config.transport == "inline":
            requests = [
                ScoreRequest(**options.model_dump(), frames=InlineFrames.from_array(frames))
                for options, frames in episodes
            ]
            return self.client.score_batch(requests)
        return self.client.score_episodes(episodes)

    def _judge(self, envs: np.ndarray, view: EnvStep, counted: np.ndarray) -> None:
        tasks = view.tasks
        started = time.perf_counter()
        frames = [self.buffers.frames(int(e)) for e in envs]  # copies: the env goes on stepping
        if self.config.to_grid:
            frames = [to_grid(f, max_pixels=self.config.max_pixels) for f in frames]
        texts = [str(tasks[e]) for e in envs]
        self.planner.task_pool.update(dict.fromkeys(map(str, tasks)))  # wrong_task draws from every env's task
        probes = [] if self.canaries is None else self.planner.plan(envs, texts, frames, MAX_BATCH_ITEMS - len(envs))
        built = [self._episode(int(e), t, f) for e, t, f in zip(envs, texts, frames, strict=True)]
        # static and reversed probes get a curve too: one that rises on them shows a judge blind to motion
        built += [self._episode(p.source, p.task, p.frames, p.request_id, p.kind in CURVE_CANARIES) for p in probes]
        self.counts["episodes"] += len(envs)
        self.counts["batches"] += 1
        self.counts["canaries"] += len(probes)
        batch = _Batch(
            envs=envs,
            tasks=texts,
            task_ids=[None if self._task_ids is None else self._task_ids[e] for e in envs],
            success=[bool(view.success[e]) for e in envs],
            success_so_far=[bool(self.env_success[e]) for e in envs],
            steps=[self.buffers.steps(int(e)) for e in envs] if self.dense else [[] for _ in envs],
            lengths=[self.buffers.length(int(e)) for e in envs],
            probes=probes,
            episodes=[(options, video) for options, video, _ in built],
            paths=[path for _, _, path in built],
            started=started,
        )
        self.judged[envs] = True
        if not self.is_async:
            self._finish(batch, *self._call(batch))
            return
        for i, env in enumerate(map(int, envs)):
            episode = DeferredEpisode(
                env=env,
                start_t=int(self.start_t[env]),
                end_t=self.t - 1,
                counted_end=bool(counted[env]),
                success=batch.success[i],
                steps=batch.steps[i],
                length=batch.lengths[i],
                task=texts[i],
                task_id=batch.task_ids[i],
                success_t=int(self.success_t[env]),
            )
            batch.deferred.append(episode)
            self.deferred.append(episode)
            self.open[env] = episode
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.async_batches, thread_name_prefix="vlm-judge")
        batch.future = self._pool.submit(self._call, batch)
        self.inflight.append(batch)

    def _call(self, batch: _Batch) -> tuple[list | None, RewardClientError | None]:
        """The request; in async mode on a request thread, touching no state of the hook but the client."""
        try:
            return self._score_batch(batch.episodes, len(batch.envs)), None
        except RewardClientError as exc:
            return None, exc
        finally:
            self._cleanup(batch.paths)
            batch.finished = time.perf_counter()

    def _finish(self, batch: _Batch, items: list | None, error: RewardClientError | None) -> None:
        """Turn a batch's answer (or its failure) into each episode's outcome, with the counts,
        fallbacks, audit and canary tallies of the synchronous hook."""
        envs = batch.envs
        if error is not None:
            self.counts["request_errors"] += 1
            if self.config.fail_on_request_error:
                raise RuntimeError(
                    f"VLM reward request for {len(envs)} episodes failed: {error}. Set "
                    f"env.train.reward_model.fail_on_request_error: False to use the '{self.config.fallback}' "
                    "fallback instead (counted in env/vlm_fallback)"
                ) from error
            logger.warning(
                "VLM reward request failed (%s); %d episodes use the '%s' fallback",
                error,
                len(envs),
                self.config.fallback,
            )
            items = [None] * len(batch.episodes)
        real = zip(envs, items[: len(envs)], strict=True)
        refused = [(int(env), item.error) for env, item in real if item is not None and item.error is not None]
        if refused:
            # the server answered, but not for these episodes (a wrong option, a deadline): a
            # request error like any other, not a model output to fall back from silently
            self.counts["request_errors"] += 1
            env, err = refused[0]
            if self.config.fail_on_request_error:
                raise RuntimeError(
                    f"VLM reward server refused {len(refused)} of {len(envs)} episodes (env {env}: "
                    f"{err.type}: {err.message}). Fix the reward_model settings, or set "
                    f"env.train.reward_model.fail_on_request_error: False to use the '{self.config.fallback}' "
                    "fallback instead (counted in env/vlm_fallback)"
                )
        elapsed_ms = (batch.finished - batch.started) * 1000
        for probe, item in zip(batch.probes, items[len(envs) :], strict=True):  # logged only; a failure is counted
            answer = item.response if item is not None else None
            score = answer.score if answer is not None else None
            self.counts["canary_failures"] += score is None
            self.canaries.record_probe(probe.kind, score, answer.progress if answer is not None else None)
            if score is None and item is not None:  # a request that failed was logged once, above
                why = item.error or item.response.parse_status.value
                logger.warning("VLM canary %s has no score (%s); no reward depends on it", probe.request_id, why)
        for i, (env, item) in enumerate(zip(map(int, envs), items[: len(envs)], strict=True)):
            score = item.response.score if item is not None and item.response is not None else None
            if score is None:
                reason = (
                    "request failed"
                    if item is None
                    else f"{item.error.type}: {item.error.message}"
                    if item.error is not None
                    else f"parse {item.response.parse_status.value}: {item.response.parse_error}"
                )
                if item is not None and item.response is not None:
                    self.counts["parse_failures"] += 1
                outcome = Outcome(0.0, self._fall_back(env, batch.success[i], reason), True, elapsed_ms)
            else:
                self.counts["scored"] += 1
                curve = item.response.progress
                outcome = Outcome(score, self._value(score), False, elapsed_ms, curve)
                self._measure(batch.task_ids[i], batch.tasks[i], score, batch.success_so_far[i], curve)
                if curve is not None and self.dense:
                    outcome.moves = self._plan_moves(batch.steps[i], batch.lengths[i], curve)
            if batch.deferred:
                batch.deferred[i].outcome = outcome
            else:
                self._apply(env, outcome)
        logger.info("VLM reward: judged %d episodes in %.0f ms (totals %s)", len(envs), elapsed_ms, self.counts)

    def _apply(self, env: int, outcome: Outcome) -> None:
        """The outcome as the env's current episode's values (what episode_info reports)."""
        self.values[env] = outcome.value if not self.is_async else 0.0  # async: the buffer gets it instead
        self.scores[env] = outcome.score
        self.fallback[env] = float(outcome.fallback)
        self.latency_ms[env] = outcome.latency_ms
        if outcome.curve is not None:
            self.curves[env] = outcome.curve
        if outcome.moves:
            self.moved[env] = -outcome.moves[-1][1]
            if not self.is_async:
                self.pending[env] = outcome.moves

    def _score_batch(self, episodes: list[tuple[ScoreOptions, np.ndarray | str]], real: int) -> list:
        """If the server refuses the request as sent (4xx, e.g. a body limit that the canary
        probes pushed it over), the real episodes go again without them."""
        try:
            return self._send(episodes)
        except RewardRequestError as exc:
            if real == len(episodes):
                raise
            logger.warning("VLM canary: request refused with its probes (%s); resending the episodes alone", exc)
            return [*self._send(episodes[:real]), *[None] * (len(episodes) - real)]

    # --- async: answers to the rollout buffer ---------------------------------------------------

    def _collect(self, wait: bool) -> None:
        """Finish the batches whose answers have come (wait: all of them, each bounded by the
        client's deadline plus its request timeout, after which it is a failed request)."""
        still: list[_Batch] = []
        for batch in self.inflight:
            if not (wait or batch.future.done()):
                still.append(batch)
                continue
            bound = batch.started + self.config.deadline_s + self.config.timeout_s - time.perf_counter()
            try:
                items, error = batch.future.result(timeout=max(bound, 0.0))
            except FutureTimeout:
                batch.finished = time.perf_counter()
                items, error = (
                    None,
                    RewardClientError(
                        f"no answer within deadline_s={self.config.deadline_s:g} s (+ timeout_s) of submission"
                    ),
                )
            self._finish(batch, items, error)
        self.inflight = still

    def _place_answered(self, current: Any, earlier: list[Any]) -> int:
        """Every deferred episode that is answered and whose value no longer stands: its rewards
        into the buffer by absolute step, its metrics into the records the worker read."""
        per_chunk = int(current.shape[1])
        ready = [e for e in self.deferred if e.outcome is not None and e.close_t is not None]
        if not ready:
            return 0
        rel = self.use_rel_reward
        targets = []
        for episode in ready:  # locate everything first: nothing is changed if one step cannot be placed
            for step, amount, _ in episode.deltas(self.reward_coef, rel):
                if amount != 0.0:
                    back, slot = locate(step, self.t, per_chunk, earlier)
                    targets.append((current if back == 0 else earlier[-back], episode.env, slot, amount))
        for rewards, env, slot, amount in targets:
            add(rewards, env, slot, amount)
        for episode in ready:
            self.deferred.remove(episode)
            self._correct_records(episode, rel)
            if self.open.get(episode.env) is None and self.start_t[episode.env] == episode.start_t:
                self._apply(episode.env, episode.outcome)  # still the env's episode (the epoch ended)
        return len(targets)

    def _keep_record(self, info: dict[str, Any], dones: Any) -> None:
        rows_total = len(next(iter(info.values())))
        if rows_total == self.num_envs:
            rows = {env: env for env in range(self.num_envs)}
        else:  # auto reset: RLinf keeps the rows of the envs done at the chunk's last step
            done = np.asarray(dones.cpu() if hasattr(dones, "cpu") else dones, dtype=bool).reshape(self.num_envs, -1)
            rows = {int(env): row for row, env in enumerate(np.flatnonzero(done[:, -1]))}
        self.records.append(Record(self.t - 1, info, rows))

    def _correct_records(self, episode: DeferredEpisode, rel: bool) -> None:
        """What the env would have logged for this episode, in each record read while it stood."""
        outcome, env = episode.outcome, episode.env
        for record in self.records:
            row = record.rows.get(env)
            if row is None or not episode.end_t <= record.last_t <= episode.close_t:
                continue
            info = record.info
            gained = sum(
                amount
                for step, amount, counted in episode.deltas(self.reward_coef, rel)
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
        for window in (self.audit, self.canaries):
            for key, value in (window.scalars() if window else {}).items():
                record.info[key] = full_like(like, len(like), value)

    # --- outcomes -------------------------------------------------------------------------------

    def _measure(self, task_id: Any, task: str, score: float, success: bool, curve: list[float | None] | None) -> None:
        """The judged episode against the env's success flag (fallback episodes were not judged): logged only."""
        if self.audit is not None:
            self.audit.record(task_key(task_id, task), task, score, success, curve)
        if self.canaries is not None:
            self.canaries.record_real(score, success)

    def _plan_moves(self, steps: list[int], length: int, curve: list[float | None]) -> list[Move]:
        """Where this episode's terminal reward was earned, by its curve (reward_client.dense)."""
        values = [None if v is None else self._value(v) for v in curve]
        frame_steps = point_frames(steps, self.config.nframes, len(curve), self.spec)
        done_action = max(length - 2, 0)  # frames = actions + the reset frame
        return moves(frame_steps, values, done_action, self.reward_coef)

    def _value(self, score: float) -> float:
        if self.config.binary_reward:
            return 1.0 if score >= self.config.success_threshold else 0.0
        return float(score)

    def _fall_back(self, env: int, env_success: bool, reason: str) -> float:
        value = float(env_success) if self.config.fallback == "env_success" else 0.0
        self.counts["fallbacks"] += 1
        logger.warning(
            "VLM reward: env %d has no score (%s); fallback '%s' = %g", env, reason, self.config.fallback, value
        )
        return value

    def _cleanup(self, paths: Sequence[str | None]) -> None:
        if self.config.keep_videos:
            return
        for path in paths:
            if path:
                try:
                    os.remove(path)
                except OSError:
                    pass
