"""The VLM reward inside one RLinf env object: episodes in, the value that stands for the judge
in RLinf's reward out (called by the patched `libero_env.py`; the ManiSkill adapter,
reward_client.rlinf.env_adapters, owns one for `maniskill_env.py`).

The hook sees every env of the env object through a per-step view (`EnvStep`: frames,
instructions, termination, truncation and success flags). `start` / `step` take that view;
`on_reset` / `on_step` are LIBERO's patch's entry points, which hand host arrays as the view
wants them (LIBERO ends an episode early only on success, so its termination is its success).

For LIBERO, RLinf computes `reward = step_penalty + reward_coef * termination` (and, under
`use_rel_reward`, the difference to the previous step). The patch hands `_calc_step_reward`
the value of this hook instead of the termination flags: 0 until an env's episode first ends,
then the judge's score (or its binary threshold) for the rest of the episode. RLinf's own
arithmetic then gives `reward_coef * score` once, at the first done step, under
`use_rel_reward`; envs that keep stepping after done are not scored again.

All envs that end in the same step are judged in one batch request (reward_client.rlinf.judging,
which also keeps the audit and the canary probes; neither touches a reward). With
`progress_points: K > 1` under `use_rel_reward` the judge's curve says where the terminal reward
was earned (reward_client.rlinf.dense), and RLinf's env worker (rlinf_patches/env_worker.patch) moves
those parts back to their steps in its rollout buffer through `place_rewards`: the rewards stay
summing to `reward_coef * score`. With `async: True` the judge is off the rollout's critical
path: an episode's end submits its batch and the step returns at once, and `place_rewards` adds
the judged reward at the episode's own done step when the answer has come (the ledger of
reward_client.rlinf.deferred). The run's config is reward_client.rlinf.config's `RewardModelConfig`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from reward_client.client import RewardClient
from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.deferred import LIBERO_RETURNS, DeferredEpisode, DeferredRewards, ReturnRule
from reward_client.rlinf.dense import Move, place
from reward_client.rlinf.episodes import EpisodeBuffers
from reward_client.rlinf.judging import Ended, EpisodeJudge, Outcome
from reward_client.rlinf.views import View, frames_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvStep:
    """One step of every env of an RLinf env object, as the hook needs it (numpy, host memory)."""

    frames: np.ndarray  # [num_envs, H, W, 3] uint8: this step's camera frame of every env
    tasks: Sequence[str]  # each env's instruction, sent as task_text
    terminations: np.ndarray  # bool [num_envs]: the env ended the episode itself (success, or failure)
    truncations: np.ndarray  # bool [num_envs]: the time limit ended it
    success: np.ndarray  # bool [num_envs]: the env's own success check this step; audited, never a reward
    task_ids: Sequence[int] | None = None  # per-task audit names (else a slug of the task text)
    views: Sequence[View] = ()  # several cameras (env.train.reward_model.views): each (label, frames), frames first


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
        self.returns = returns
        self.auto_reset = auto_reset
        # a curve places rewards only where RLinf rewards the change of the hook's value (the
        # success bonus appears once): without use_rel_reward it would stand at every later step
        self.dense = config.progress_points > 1 and use_rel_reward
        if self.dense and auto_reset:
            raise ValueError(
                "env.train.reward_model.progress_points > 1 places rewards within an episode, which needs episodes "
                "that start with the rollout epoch: set env.train.auto_reset: False, or progress_points: 1"
            )
        self.buffers = EpisodeBuffers(num_envs, config.nframes)  # the (first) view's frames
        self.more_buffers: list[EpisodeBuffers] = []  # several views: the others', in order (same steps kept)
        self.view_names: list[str] = []  # several views: each camera's label, in order
        self._cameras: list[str] | None = None  # the labels episodes are recorded from ([]: one view), once seen
        self.judge = EpisodeJudge(config, client, reward_coef, self.buffers.spec, self.dense)
        self.ledger = (
            DeferredRewards(self.judge, num_envs, reward_coef, use_rel_reward, returns) if config.async_ else None
        )
        self.pending: dict[int, list[Move]] = {}  # sync: env -> reward moves not yet placed by the env worker
        self.curves: dict[int, list[float | None]] = {}  # env -> its episode's progress curve, once judged
        self.moved = np.zeros(num_envs, dtype=np.float64)  # reward moved back from each env's done step
        self.placed = 0  # rewards placed in RLinf's rollout buffer so far
        self._unplaced_warned = False
        self.judged = np.zeros(num_envs, dtype=bool)
        self.values = np.zeros(num_envs, dtype=np.float64)
        self.scores = np.zeros(num_envs, dtype=np.float64)
        self.fallback = np.zeros(num_envs, dtype=np.float64)
        self.latency_ms = np.zeros(num_envs, dtype=np.float64)
        self.env_success = np.zeros(num_envs, dtype=bool)  # the env's flag so far: measured against, never a reward
        self.t = 0  # actions stepped by every env since the hook was built (every env steps together)
        self.start_t = np.zeros(num_envs, dtype=np.int64)  # absolute index of each env's episode's first action
        self.success_t = np.full(num_envs, -1, dtype=np.int64)  # absolute step of the episode's first success
        self.judge.wait_for_server()

    @classmethod
    def from_rlinf_config(cls, cfg: Any, num_envs: int, returns: ReturnRule = LIBERO_RETURNS) -> VLMRewardHook:
        """Build from RLinf's env config (an OmegaConf node holding `reward_model`)."""
        return cls(
            RewardModelConfig.from_rlinf(cfg.reward_model),
            num_envs,
            ignore_terminations=bool(cfg.ignore_terminations),
            reward_coef=float(cfg.get("reward_coef", 1.0)),
            use_rel_reward=bool(cfg.get("use_rel_reward", False)),
            auto_reset=bool(cfg.get("auto_reset", False)),
            returns=returns,
        )

    @property
    def is_async(self) -> bool:
        return self.ledger is not None

    @property
    def counts(self) -> dict[str, int]:
        return self.judge.counts

    @property
    def client(self) -> RewardClient:
        return self.judge.client

    @client.setter
    def client(self, client: RewardClient) -> None:
        self.judge.client = client

    # --- episodes and steps (the env's side) ---------------------------------------------------

    def start(self, env_idx: Any, frames: Any, views: Sequence[View] = ()) -> None:
        """Episodes start for env_idx (None: every env); frames holds all envs' current frames
        (views: every camera's, when the judge sees several)."""
        ids = np.arange(self.num_envs) if env_idx is None else np.atleast_1d(np.asarray(env_idx, dtype=np.int64))
        new_epoch = len(ids) == self.num_envs  # every env restarts: a new rollout epoch
        if self.ledger is not None:
            self.ledger.restart(ids, self.t, new_epoch, self.auto_reset)
        frames = np.asarray(frames)
        self.buffers.start(ids, frames[ids])
        if self._same_cameras(views, ids, adopt=new_epoch):
            for buffers, (_, more) in zip(self.more_buffers, views[1:], strict=True):
                buffers.start(ids, np.asarray(more)[ids])
        for arr in (self.values, self.scores, self.fallback, self.latency_ms, self.moved):
            arr[ids] = 0.0
        self.judged[ids] = False
        self.env_success[ids] = False
        self.start_t[ids] = self.t
        self.success_t[ids] = -1
        for env in map(int, ids):
            self.curves.pop(env, None)
        stale = [env for env in map(int, ids) if self.pending.pop(env, None)]
        if stale and not self._unplaced_warned:
            self._unplaced_warned = True
            logger.warning(
                "VLM reward: the progress-curve rewards of envs %s were never placed (is rlinf_patches/"
                "env_worker.patch applied?); their episodes kept the terminal reward",
                stale,
            )
        if new_epoch:
            self.judge.new_window()

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
        if self.ledger is not None:
            self.ledger.stand(now, counted, self.success_t)
        self.buffers.append(view.frames, running)
        if self._same_cameras(view.views, np.flatnonzero(running)):
            for buffers, (_, more) in zip(self.more_buffers, view.views[1:], strict=True):
                buffers.append(np.asarray(more), running)
        if self.ignore_terminations:
            ended = view.truncations
        elif self.config.score_on_truncation:
            ended = view.terminations | view.truncations
        else:
            ended = view.terminations
        new = np.flatnonzero(ended & running)
        if len(new):
            self._judge(new, view, counted)
        if self.ledger is not None:
            self.ledger.check_placed(self.t)
        return self.values.copy()

    def on_reset(self, env_idx: Any, obs: Any) -> None:
        """LIBERO's reset: see `start`; obs is the env's observation (or its main_images)."""
        self.start(env_idx, *frames_of(obs, self.config.views))

    def on_step(
        self,
        obs: Any,
        task_descriptions: Sequence[str],
        terminations: Any,
        truncations: Any,
        task_ids: Any = None,
    ) -> np.ndarray:
        """LIBERO's step: the value that replaces the termination flags in RLinf's reward. obs is
        the env's observation (or its main_images); task_ids (LIBERO's) name the per-task audit
        scalars (else a slug of the task text does)."""
        terminations = np.asarray(terminations, dtype=bool)
        frames, views = frames_of(obs, self.config.views)
        return self.step(
            EnvStep(
                frames=frames,
                tasks=task_descriptions,
                terminations=terminations,
                truncations=np.asarray(truncations, dtype=bool),
                success=terminations,  # LIBERO ends an episode early only when its success check fires
                task_ids=task_ids,
                views=views,
            )
        )

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
        if self.ledger is not None:
            placed = self.ledger.place(current, earlier, self.t, episode_info, dones, last, self._settle)
        elif self.pending:
            pending, self.pending = self.pending, {}
            placed = place(pending, current, earlier, chunk_index)
        else:
            return 0
        self.placed += placed
        return placed

    def episode_info(self) -> dict[str, np.ndarray]:
        """Per-episode values for `infos["episode"]` (RLinf logs them as env/<key>), plus this rollout
        epoch's audit and canary aggregates in every env's slot (reward_client.rlinf.audit says why)."""
        info = {
            "vlm_score": self.scores.copy(),
            "vlm_fallback": self.fallback.copy(),
            "vlm_latency_ms": self.latency_ms.copy(),
        }
        if self.dense:  # reward moved back from the done step to where the curve rose
            info["vlm_moved_reward"] = self.moved.copy()
        # answers the client refused as impossible (and retried), so far: a faulty server or proxy
        info["vlm_protocol_errors"] = np.full(self.num_envs, float(getattr(self.client, "protocol_errors", 0)))
        info.update({k: np.full(self.num_envs, v) for k, v in self.judge.scalars().items()})
        return info

    def close(self) -> None:
        """Stop the async request threads (answers still out are dropped)."""
        if self.ledger is not None:
            self.ledger.close()

    # --- judging ------------------------------------------------------------------------------

    def _same_cameras(self, views: Sequence[View], envs: Any, adopt: bool = False) -> bool:
        """Whether these views are the cameras the envs' episodes are recorded from. The first
        views seen set them (and every rollout epoch's first reset may change them: `adopt`);
        other cameras later mark the running episodes of `envs`, which are then not judged (a
        request cannot carry a camera some of its frames lack)."""
        names = [name for name, _ in views]
        if self._cameras is None or (adopt and names != self._cameras):
            if self._cameras is not None:
                logger.warning("VLM reward: the env's cameras are now %s (were %s)", names, self._cameras)
            self._cameras = self.view_names = names
            self.more_buffers = [
                EpisodeBuffers(self.num_envs, self.config.nframes, what=f"{name} frames") for name in names[1:]
            ]
            return True
        if names == self._cameras:
            return True
        why = (
            f"the env's cameras changed mid-episode: the observation holds {_cameras(names)}, "
            f"the episode was recorded from {_cameras(self._cameras)}"
        )
        for env in map(int, envs):
            self.buffers.mark(env, why)
        return False

    def _episode_error(self, env: int) -> str | None:
        """Why env's episode cannot be judged as recorded (a camera changed size or went), or None."""
        return next(filter(None, (b.error(env) for b in (self.buffers, *self.more_buffers))), None)

    def _judge(self, envs: np.ndarray, view: EnvStep, counted: np.ndarray) -> None:
        ended = [
            Ended(
                env=env,
                task=str(view.tasks[env]),
                task_id=None if view.task_ids is None else view.task_ids[env],
                frames=(frames := self.buffers.frames(env)),  # copies: the env goes on stepping
                views=[] if (error := self._episode_error(env)) else self._more_views(env, frames),
                error=error,
                success=bool(view.success[env]),
                success_so_far=bool(self.env_success[env]),
                steps=self.buffers.steps(env) if self.dense else [],
                length=self.buffers.length(env),
            )
            for env in map(int, envs)
        ]
        batch = self.judge.batch(ended, view.tasks)
        self.judged[envs] = True
        if self.ledger is None:
            for e, outcome in zip(ended, self.judge.outcomes(batch, *self.judge.call(batch)), strict=True):
                self._apply(e.env, outcome)
            return
        self.ledger.submit(batch, self.t - 1, self.start_t, counted, self.success_t)

    def _more_views(self, env: int, frames: np.ndarray) -> list[View]:
        """Every camera's frames of env's episode when the judge sees several (frames: the first's)."""
        if not self.more_buffers:
            return []
        more = [(name, b.frames(env)) for name, b in zip(self.view_names[1:], self.more_buffers, strict=True)]
        return [(self.view_names[0], frames), *more]

    def _settle(self, episode: DeferredEpisode) -> None:
        """An async episode placed after its env stopped stepping (the epoch ended): its values
        are still the env's current episode's, for episode_info."""
        if self.start_t[episode.env] == episode.start_t:
            self._apply(episode.env, episode.outcome)

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


def _cameras(names: Sequence[str]) -> str:
    return f"cameras {', '.join(names)}" if names else "one camera"


__all__ = ["EnvStep", "RewardModelConfig", "VLMRewardHook"]
