"""Asynchronous judging (`reward_model.async`) against the synchronous hook on the same episodes.

The judge is the fake engine (it scores the brightness of the last frame it sees, so each
episode gets its own score). The env and the env worker are scripted stand-ins for RLinf's,
because RLinf's own need its simulator environment: `ScriptedEnv` does LiberoEnv's (or
ManiskillEnv's) reward and metric arithmetic (`_calc_step_reward`, `_record_metrics`,
`chunk_step` with auto reset at the chunk's end), and `rollout` does EnvWorker's
(`_run_interact_once`: a chunk's rewards appended to the rollout buffer at the next chunk step,
env_info read as `env_interact_step` reads it, recorded when it records it, the patched
`place_vlm_rewards` after every chunk step). The real thing: the tiny runs through RLinf's
entry point (tests/test_rlinf_training_loop.py) and the dense scenario on the real simulator
(tests/test_rlinf_integration.py).
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import pytest

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.deferred import LIBERO_RETURNS, MANISKILL_RETURNS, ReturnRule
from reward_client.rlinf.hook import EnvStep, VLMRewardHook
from tests.helpers.servers import InProcessServer

N, COEF = 3, 5.0
TASKS = ["put the bowl on the plate"] * N


@pytest.fixture(scope="module")
def server():
    with InProcessServer(engine_option=["delay_ms=20"]) as s:
        yield s


class ScriptedEnv:
    """LiberoEnv's / ManiskillEnv's arithmetic around the hook; env e's k-th episode ends by
    success after ends[e][k] actions (None: truncation at max_steps)."""

    def __init__(
        self,
        hook: VLMRewardHook,
        ends: dict[int, list[int | None]],
        max_steps: int,
        rel: bool,
        auto_reset: bool,
        rule: ReturnRule,
        penalty: float = 0.0,
        ignore: bool = False,
    ):
        self.hook, self.ends, self.max_steps, self.rel, self.auto_reset, self.rule = (
            hook,
            ends,
            max_steps,
            rel,
            auto_reset,
            rule,
        )
        self.penalty, self.ignore = penalty, ignore
        self.episode = np.zeros(N, dtype=int)  # episodes begun per env
        self.elapsed = np.zeros(N, dtype=int)
        self.prev = np.zeros(N)
        self.returns = np.zeros(N)
        self.success_once = np.zeros(N, dtype=bool)
        self.success_len = np.zeros(N, dtype=int)

    def frames(self) -> np.ndarray:
        level = (23 * np.arange(N) + 6 * self.elapsed + 50 * self.episode) % 250
        return np.broadcast_to(level[:, None, None, None], (N, 28, 28, 3)).astype(np.uint8)

    def reset(self, ids: np.ndarray) -> None:
        self.episode[ids] += 1
        for arr in (self.elapsed, self.prev, self.returns, self.success_len):
            arr[ids] = 0
        self.success_once[ids] = False
        self.hook.start(ids, self.frames())

    def step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        self.elapsed += 1
        end = [self._end(e) for e in range(N)]
        terms = np.array([x is not None and self.elapsed[e] == x for e, x in enumerate(end)])
        truncs = self.elapsed >= self.max_steps
        value = self.hook.step(EnvStep(self.frames(), TASKS, terms, truncs, terms))
        reward = self.penalty + COEF * value
        if self.rel:
            reward, self.prev = reward - self.prev, reward
        if self.rule.stops_at_success:
            self.returns += reward * ~self.success_once
        else:
            self.returns += reward
        self.success_len[terms & ~self.success_once] = self.elapsed[terms & ~self.success_once]
        self.success_once |= terms
        length = (
            np.where(self.success_once, self.success_len, self.elapsed)
            if self.rule.reward_len_at_success
            else self.elapsed
        )
        episode = {
            "return": self.returns.copy(),
            "episode_len": self.elapsed.copy(),
            "reward": self.returns / np.maximum(length, 1),
            "success_once": self.success_once.copy(),
            **self.hook.episode_info(),
        }
        return reward, terms, truncs, {"episode": episode}

    def _end(self, env: int) -> int | None:
        plan = self.ends.get(env, [])
        k = self.episode[env] - 1
        return plan[k] if k < len(plan) else None

    def chunk_step(self, size: int) -> tuple[np.ndarray, np.ndarray, dict]:
        rewards, dones = np.zeros((N, size)), np.zeros((N, size), dtype=bool)
        for i in range(size):
            rewards[:, i], terms, truncs, infos = self.step()
            dones[:, i] = truncs if self.ignore else terms | truncs
        if self.auto_reset:
            past = dones.any(axis=1)
            dones[:] = False
            dones[:, -1] = past
            if past.any():
                infos = {"final_info": infos, "episode": {}}
                self.reset(np.flatnonzero(past))
        return rewards, dones, infos


def rollout(env: ScriptedEnv, epochs: int, chunks: int, size: int, eager: bool) -> tuple[np.ndarray, dict]:
    """EnvWorker._run_interact_once over `epochs` rollout epochs: the trajectory's rewards
    [N, steps] and what RLinf logs (the mean of every recorded env_info key)."""
    buffer: list[np.ndarray] = []  # EmbodiedRolloutResult.rewards
    metrics: dict[str, list] = defaultdict(list)
    for epoch in range(epochs):
        if not env.auto_reset or epoch == 0:  # bootstrap_step: a reset of every env
            env.reset(np.arange(N))
        previous = None
        for k in range(chunks):
            if previous is not None:  # appended at the next chunk step, as compute_bootstrap_rewards' clone
                buffer.append(previous.copy())
            rewards, dones, infos = env.chunk_step(size)
            if env.auto_reset:
                env_info = (
                    {key: v[dones[:, -1]] for key, v in infos["final_info"]["episode"].items()} if dones.any() else {}
                )
            else:
                env_info = dict(infos["episode"])
            if eager:  # every answer in before the worker's call: placed in the chunk it ended in
                for flight in list(env.hook.ledger.inflight if env.hook.ledger else []):
                    flight.future.result()
            env.hook.place_rewards(rewards, buffer, k, episode_info=env_info, dones=dones, last=k == chunks - 1)
            if env.auto_reset or k == chunks - 1:
                for key, value in env_info.items():
                    metrics[key].append(value)
            previous = rewards
        buffer.append(previous.copy())
    logged = {key: float(np.mean(np.concatenate(v))) for key, v in metrics.items()}
    return np.concatenate(buffer, axis=1), logged


def make_hook(
    server, async_: bool, rel: bool, auto_reset: bool, rule: ReturnRule, ignore: bool = False, **options
) -> VLMRewardHook:
    options = {"url": server.url, "wait_ready_s": 5, **options}
    config = RewardModelConfig(enable=True, score_mode="logprob", nframes=8, **{"async": async_}, **options)
    return VLMRewardHook(config, N, ignore, reward_coef=COEF, use_rel_reward=rel, auto_reset=auto_reset, returns=rule)


def both(
    server,
    ends,
    *,
    rel=True,
    auto_reset=False,
    rule=LIBERO_RETURNS,
    epochs=1,
    chunks=4,
    size=4,
    max_steps=16,
    penalty=0.0,
    eager=False,
    ignore=False,
    **options,
):
    out = {}
    for async_ in (False, True):
        h = make_hook(server, async_, rel, auto_reset, rule, ignore, **options)
        env = ScriptedEnv(h, ends, max_steps, rel, auto_reset, rule, penalty, ignore)
        out[async_] = (*rollout(env, epochs, chunks, size, eager), h)
    return out[False], out[True]


def assert_same(sync, asyn, skip: tuple[str, ...] = ("vlm_latency_ms",)):
    (rewards, logged, h), (a_rewards, a_logged, a) = sync, asyn
    np.testing.assert_allclose(a_rewards, rewards, atol=1e-5)
    assert a_logged.keys() == logged.keys()
    for key in logged:
        if not key.startswith(skip):
            assert a_logged[key] == pytest.approx(logged[key], abs=1e-5), key
    assert a.counts == h.counts
    assert not a.ledger.deferred and not a.ledger.inflight and not a.ledger.records
    return rewards


@pytest.mark.parametrize("eager", [False, True], ids=["answers_at_epoch_end", "answers_in_their_chunk"])
@pytest.mark.parametrize("rel", [True, False], ids=["rel", "absolute"])
def test_libero_terminal_scores_without_auto_reset(server, rel, eager):
    # env 0 succeeds mid-chunk, env 1 at a chunk's end, env 2 truncates at the epoch's last step
    sync, asyn = both(server, {0: [6, 6], 1: [12, 12]}, rel=rel, eager=eager, penalty=-1.0 if rel else 0.0, epochs=2)
    rewards = assert_same(sync, asyn)
    assert "return" in sync[1] and sync[1]["vlm_score"] > 0
    if rel:  # the bonus once, at the done step, and the penalty at every step
        scores = sync[2].scores
        assert rewards[0, 16 + 5] == pytest.approx(COEF * scores[0], abs=1e-4)  # the second epoch's


@pytest.mark.parametrize("rel", [True, False], ids=["rel", "absolute"])
@pytest.mark.parametrize("size", [1, 4], ids=["chunk1", "chunk4"])
def test_maniskill_auto_reset_places_by_env_and_step(server, rel, size):
    # episodes end mid-chunk, reset at the chunk's end, and run across the two rollout epochs
    ends = {0: [3, 5, 9, 2], 1: [7, 4], 2: [None, 6]}
    sync, asyn = both(
        server,
        ends,
        rel=rel,
        auto_reset=True,
        rule=MANISKILL_RETURNS,
        epochs=2,
        chunks=16 // size,
        size=size,
        max_steps=10,
    )
    # the audit's windows are rollout epochs; under auto reset an episode joins the window its
    # answer lands in, so the logged aggregates may differ (never a reward)
    rewards = assert_same(sync, asyn, skip=("vlm_latency_ms", "vlm_audit/", "vlm_canary/"))
    assert sync[2].counts["episodes"] >= 7 and np.count_nonzero(rewards) > 0


def test_progress_curves_are_placed_at_their_steps_in_both_modes(server):
    sync, asyn = both(server, {0: [6], 1: [13]}, progress_points=4, epochs=2)
    rewards = assert_same(sync, asyn)
    assert np.count_nonzero(rewards[0, :5]) > 0  # part of env 0's reward before its done step
    assert sync[1]["vlm_moved_reward"] > 0


def test_live_audit_and_canaries_log_the_same(server):
    options = {"canary_fraction": 1.0, "canary_tasks": ["open the drawer"], "progress_points": 3}
    sync, asyn = both(server, {0: [6], 1: [12]}, **options)
    assert_same(sync, asyn)
    assert any(k.startswith("vlm_canary/") for k in sync[1]) and "vlm_audit/episodes" in sync[1]
    assert sync[2].counts["canaries"] == 3 * N


@pytest.mark.parametrize("rel", [True, False], ids=["rel", "absolute"])
def test_ignore_terminations_and_binary_reward(server, rel):
    # env 0 succeeds at step 5 and is judged at the truncation: LIBERO's return stopped at its success
    sync, asyn = both(server, {0: [5]}, rel=rel, ignore=True, binary_reward=True, success_threshold=0.3)
    assert_same(sync, asyn)


def test_sum_per_episode_and_return_are_the_judged_score(server):
    (rewards, logged, h), asyn = both(server, {0: [6], 1: [12]})
    assert_same((rewards, logged, h), asyn)
    sums = asyn[0].sum(axis=1)  # one episode per env
    assert sums == pytest.approx(list(COEF * h.scores), abs=1e-4)
    assert logged["return"] == pytest.approx(COEF * h.scores.mean(), abs=1e-4)


def test_failed_requests_fall_back_counted_as_in_sync(server):
    sync, asyn = both(
        server,
        {0: [6]},
        url="http://127.0.0.1:9",
        fail_on_request_error=False,
        fallback="env_success",
        wait_ready_s=0,
        deadline_s=0.5,
        timeout_s=0.2,
    )
    assert_same(sync, asyn)
    assert asyn[2].counts["fallbacks"] == N and asyn[2].counts["request_errors"] == 2  # steps 6 and 16
    assert asyn[1]["vlm_fallback"] == 1.0


def test_a_failed_request_stops_training_when_asked(server):
    h = make_hook(
        server,
        True,
        True,
        False,
        LIBERO_RETURNS,
        url="http://127.0.0.1:9",
        wait_ready_s=0,
        deadline_s=0.5,
        timeout_s=0.2,
    )
    env = ScriptedEnv(h, {}, 8, True, False, LIBERO_RETURNS)
    with pytest.raises(RuntimeError, match="fail_on_request_error"):
        rollout(env, 1, 2, 4, eager=False)


def test_the_async_step_does_not_wait_for_the_judge(server):
    h = make_hook(server, True, True, False, LIBERO_RETURNS)
    env = ScriptedEnv(h, {0: [2]}, 16, True, False, LIBERO_RETURNS)
    env.reset(np.arange(N))
    env.step()
    reward, *_ = env.step()  # env 0 ends here: submitted, not judged yet
    assert reward[0] == 0.0 and len(h.ledger.inflight) == 1 and h.ledger.deferred[0].end_t == 1


def test_without_the_env_worker_patch_async_refuses_to_lose_rewards(server, caplog):
    h = make_hook(server, True, True, False, LIBERO_RETURNS)
    env = ScriptedEnv(h, {0: [2]}, 4, True, False, LIBERO_RETURNS)
    env.reset(np.arange(N))
    for _ in range(4):
        env.step()
    with pytest.raises(RuntimeError, match=r"env_worker\.patch"):
        env.reset(np.arange(N))  # the next rollout epoch: nobody placed the last one's rewards


def test_the_config_key_is_async():
    config = RewardModelConfig.model_validate({"enable": True, "async": True})
    assert config.async_ and not RewardModelConfig().async_
    with pytest.raises(ValueError, match="async_batches"):
        RewardModelConfig.model_validate({"async_batches": 0})


logging.getLogger("reward_client").setLevel(logging.ERROR)  # fallbacks warn per episode
