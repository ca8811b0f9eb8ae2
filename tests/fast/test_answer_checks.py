"""The client believes no answer that cannot be right (fast tier).

A small real HTTP server on 127.0.0.1 (tests/helpers/faulty.py) plays a faulty reward server or
proxy: its first answers are impossible (scores 7.5, -3.0, NaN; indices 100.. for 3 episodes, all
0; an item with neither a response nor an error; too few items; a curve point above 1), right only
when read leniently (`true` or `"0.7"` as a score, `[false, true]` as a curve, `"1"`, `true` or
`1.0` as an index), self-contradictory (a failed parse with a score, a score that is not the
curve's last point) or curves of the wrong length for the K asked; then it answers correctly. The
real httpx clients (sync and async, JSON and raw batches, /score), the real RLinf hook and
reward_tools.label_episodes go through it. Each wrong answer must be a counted protocol error
that is retried, never a reward."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import numpy as np
import pytest

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardUnavailable
from reward_client.rlinf.hook import RewardModelConfig, VLMRewardHook
from reward_protocol.score import InlineFrames, ScoreOptions, ScoreRequest
from tests.helpers.faulty import CURVE_FAULTS, FAULTS, GOOD, FaultyServer, curve

FAST = RetryPolicy(deadline_s=10, backoff_initial_s=0.02, backoff_max_s=0.05)
N = 3


def frames(level: int = 90) -> np.ndarray:
    return np.full((4, 28, 28, 3), level, np.uint8)


def options(points: int = 1) -> ScoreOptions:
    return ScoreOptions(task_text="open the drawer", nframes=4, progress_points=points)


def json_requests(points: int = 1) -> list[ScoreRequest]:
    return [ScoreRequest(**options(points).model_dump(), frames=InlineFrames.from_array(frames())) for _ in range(N)]


def raw_episodes(points: int = 1) -> list:
    return [(options(points), frames()) for _ in range(N)]


def protocol_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "impossible answer" in r.getMessage()]


def score_through(server: FaultyServer, transport: str, points: int = 1):
    with RewardClient(server.url, FAST) as client:
        if transport == "json":
            items = client.score_batch(json_requests(points))
        elif transport == "raw":
            items = client.score_episodes(raw_episodes(points))
        else:  # /score, one episode
            return [client.score(json_requests(points)[0])], client
        assert [item.index for item in items] == list(range(N))
        return [item.response for item in items], client


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("transport", ["json", "raw"])
def test_an_impossible_answer_is_a_counted_protocol_error_and_is_retried(fault, transport, caplog):
    """Scores out of range, wrong indices, and answers only a lax reading makes right (`true` or
    `"0.7"` as a score, `[false, true]` as a curve, `"1"`, `true` or `1.0` as an index), and parts
    that disagree (a failed parse with a score, a score that is not the curve's last point): each
    a protocol error naming what is wrong, retried; only the right answer becomes a score."""
    caplog.set_level(logging.WARNING, "reward_client")
    with FaultyServer(fault, faulty=2) as server:
        responses, client = score_through(server, transport)
    assert [r.score for r in responses] == [GOOD] * N  # only the correct answer became rewards
    assert client.protocol_errors == 2 and client.attempts == 3
    assert client.stats()["protocol_errors"] == 2
    warnings = protocol_warnings(caplog)
    assert len(warnings) == 2 and all(FAULTS[fault][1] in w for w in warnings), warnings


@pytest.mark.parametrize("fault", sorted(CURVE_FAULTS))
@pytest.mark.parametrize("transport", ["json", "raw", "score"])
def test_a_curve_must_have_exactly_the_points_asked_for(fault, transport, caplog):
    """Asked for K = 4: 2 points, 20 points or none at all are protocol errors (before: 2 points
    were placed at the wrong steps, 20 raised ProgressPointsError, none made the run sparse)."""
    caplog.set_level(logging.WARNING, "reward_client")
    with FaultyServer(fault, faulty=1) as server:
        responses, client = score_through(server, transport, points=4)
    assert [r.progress for r in responses] == [curve(4)] * len(responses)
    assert [r.score for r in responses] == [GOOD] * len(responses)
    assert client.protocol_errors == 1
    assert CURVE_FAULTS[fault][1] in protocol_warnings(caplog)[0]


def test_a_curve_on_a_one_score_request_is_refused():
    """progress_points 1 asks for one score: an answer with a 2-point curve is not for this request."""
    with FaultyServer("curve_2_points", faulty=1) as server:
        responses, client = score_through(server, "raw", points=1)
    assert [r.progress for r in responses] == [None] * N and client.protocol_errors == 1


@pytest.mark.parametrize("fault", ["score_nan", "indices_100", "neither", "score_true", "index_float"])
def test_the_async_client_checks_its_answers_too(fault):
    async def go():
        client = AsyncRewardClient(server.url, FAST)
        try:
            return await client.score_batch(json_requests()), await client.score_episodes(raw_episodes()), client
        finally:
            await client.aclose()

    with FaultyServer(fault, faulty=1) as server:
        as_json, as_raw, client = asyncio.run(go())
    assert [i.response.score for i in as_json + as_raw] == [GOOD] * 2 * N
    assert client.protocol_errors == 1


def test_the_async_client_checks_the_curve_length():
    async def go():
        client = AsyncRewardClient(server.url, FAST)
        try:
            return await client.score_episodes(raw_episodes(4)), await client.score(json_requests(4)[0]), client
        finally:
            await client.aclose()

    with FaultyServer("curve_20_points", faulty=2) as server:
        items, single, client = asyncio.run(go())
    assert [i.response.progress for i in items] == [curve(4)] * N and single.progress == curve(4)
    assert client.protocol_errors == 2


@pytest.mark.parametrize(
    "fault", ["score_7.5", "score_nan", "curve_point_2", "score_true", "score_string", "no_number_with_score"]
)
def test_a_single_score_is_checked(fault):
    with FaultyServer(fault, faulty=1) as server:
        responses, client = score_through(server, "score")
    assert responses[0].score == GOOD and client.protocol_errors == 1


def test_a_server_that_keeps_answering_wrongly_is_unavailable_at_the_deadline():
    policy = RetryPolicy(deadline_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.1)
    with FaultyServer("indices_all_0", faulty=10**6) as server, RewardClient(server.url, policy) as client:
        started = time.monotonic()
        with pytest.raises(RewardUnavailable, match="protocol error: the answer's indices are"):
            client.score_batch(json_requests())
        assert time.monotonic() - started < 1.5
        # every answer was wrong; only the last attempt may have been cut by the deadline instead
        assert client.protocol_errors >= 3 and client.attempts - client.protocol_errors in (0, 1)


def run_hook(
    server: FaultyServer, steps: int = 3, policy: RetryPolicy = FAST, use_rel_reward: bool = False, **options
) -> tuple[VLMRewardHook, np.ndarray]:
    """Episodes of N envs that all end after `steps` steps, judged by the hook through `server`."""
    options.setdefault("nframes", 4)
    config = RewardModelConfig(enable=True, url=server.url, wait_ready_s=5, **options)
    client = RewardClient(server.url, policy)
    h = VLMRewardHook(config, num_envs=N, client=client, use_rel_reward=use_rel_reward)
    h.on_reset(None, np.full((N, 28, 28, 3), 50, np.uint8))
    for t in range(1, steps + 1):
        frames_t = np.full((N, 28, 28, 3), 50 + t, np.uint8)
        values = h.on_step(frames_t, ["open the drawer"] * N, np.zeros(N, bool), np.full(N, t == steps))
    return h, values


LENIENT = ["score_true", "score_string", "progress_bools", "index_string", "index_true", "index_float"]
DISAGREEING = ["no_number_with_score", "null_score_ok", "score_not_last_point"]


@pytest.mark.parametrize("fault", ["neither", "score_-3.0", "score_true", "index_float"])
def test_the_hook_falls_back_and_counts_instead_of_crashing(fault):
    """`fail_on_request_error: False`: an impossible answer is a counted fallback (before: an item
    with neither field raised AttributeError in the hook, and -3.0 or `true` became the reward)."""
    policy = RetryPolicy(deadline_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.1)
    with FaultyServer(fault, faulty=10**6) as server:
        h, values = run_hook(server, policy=policy, fail_on_request_error=False)
    assert values.tolist() == [0.0] * N  # the 'zero' fallback, not -3.0
    assert h.counts["fallbacks"] == N and h.counts["request_errors"] == 1 and h.counts["scored"] == 0
    info = h.episode_info()
    assert info["vlm_fallback"].tolist() == [1.0] * N
    assert info["vlm_protocol_errors"][0] == h.client.protocol_errors >= 3


@pytest.mark.parametrize("fault", LENIENT + DISAGREEING)
@pytest.mark.parametrize("transport", ["raw", "inline"])
def test_the_hook_rewards_only_a_strict_answer(fault, transport):
    """Before: `"score": true` became reward 1.0 through the hook with vlm_protocol_errors at 0."""
    with FaultyServer(fault, faulty=1) as server:
        h, values = run_hook(server, transport=transport)
    assert values.tolist() == [GOOD] * N  # the retried, right answer; never the lenient one
    assert h.counts["scored"] == N and h.counts["fallbacks"] == 0
    assert h.episode_info()["vlm_protocol_errors"].tolist() == [1.0] * N


@pytest.mark.parametrize("fault", sorted(CURVE_FAULTS))
def test_a_dense_hook_places_only_a_curve_of_the_points_asked_for(fault):
    """K = 4 under use_rel_reward: a curve of 2 or 20 points, or none, is a counted protocol error
    and the right curve's moves are placed (before: 2 points placed at the wrong steps, 20 raised
    ProgressPointsError out of on_step, none left the run sparse)."""
    dense = {"progress_points": 4, "use_rel_reward": True, "nframes": 8, "steps": 8}
    with FaultyServer(fault, faulty=0) as server:
        right, _ = run_hook(server, **dense)
    with FaultyServer(fault, faulty=1) as server:
        h, values = run_hook(server, **dense)
    assert h.curves == right.curves == {env: curve(4) for env in range(N)}
    assert h.pending == right.pending and all(h.pending.values())  # the same moves, to the same steps
    assert values.tolist() == [GOOD] * N
    assert h.episode_info()["vlm_protocol_errors"].tolist() == [1.0] * N


def test_a_curve_that_never_has_the_points_asked_for_stops_training_naming_the_answer():
    """fail_on_request_error: True: the run stops saying the server's answer was wrong, not that
    the user's progress_points is out of range."""
    policy = RetryPolicy(deadline_s=0.5, backoff_initial_s=0.05, backoff_max_s=0.1)
    dense = {"progress_points": 4, "use_rel_reward": True, "nframes": 8, "steps": 8}
    with FaultyServer("curve_20_points", faulty=10**6) as server:
        with pytest.raises(RuntimeError, match="progress curve has 20 points; 4 were asked for") as caught:
            run_hook(server, policy=policy, **dense)
    assert "out of range" not in str(caught.value)


def test_a_proxys_413_halves_the_batch_until_it_passes():
    with FaultyServer("score_7.5", faulty=0, max_items=1) as server, RewardClient(server.url, FAST) as client:
        items = client.score_episodes(raw_episodes())
        assert [item.response.score for item in items] == [GOOD] * N
        assert client.split_requests == 2  # 3 -> 1 + 2 -> 1 + 1 + 1


def test_the_error_at_the_deadline_names_why_the_attempts_before_a_cut_short_one_failed():
    """The deadline can cut the last attempt short (a timeout): the error still says what the
    attempts before it got, here answers that could not be right."""
    from reward_client.client import _Attempts

    with RewardClient("http://127.0.0.1:9", RetryPolicy(deadline_s=60.0)) as client:
        attempts = _Attempts(client, "/score/batch")
        for _ in range(3):
            attempts.failed(None, "protocol error: the answer's indices are [0, 0]")
        attempts.failed(None, "ReadTimeout: the attempt's time bound passed")
        message = str(attempts._unavailable())
    assert "4 attempts; last: ReadTimeout" in message
    assert "before it: protocol error: the answer's indices are [0, 0]" in message


@pytest.mark.parametrize(
    ("fault", "rule"),
    [
        ("score_true", ["--rule", "score"]),
        ("no_number_with_score", ["--rule", "score"]),
        ("curve_2_points", ["--points", "4"]),
    ],
)
def test_label_episodes_labels_only_from_a_strict_answer(fault, rule, tmp_path):
    """reward_tools.label_episodes reads the judge through the same client: `"score": true` no
    longer labels a success (before: score 1.0), nor a failed parse that carries 0.9; a 2-point
    curve for K = 4 is not placed."""
    from reward_tools import label_episodes
    from tests.fast.test_label_episodes import write_rlinf_episodes

    write_rlinf_episodes(tmp_path / "in", [(8, 4, "open the drawer"), (8, None, "open the drawer")])
    with FaultyServer(fault, faulty=1) as server:
        args = ["--url", server.url, "--episodes", str(tmp_path / "in"), "--out", str(tmp_path / "out"), *rule]
        code = label_episodes.main(args)
    assert code == 0
    lines = (tmp_path / "out" / "judged.jsonl").read_text().splitlines()[1:]
    entries = [json.loads(line) for line in lines]
    assert [e["score"] for e in entries] == [GOOD, GOOD]
    assert [e["curve"] for e in entries] == [curve(4) if "--points" in rule else None] * 2
    report = json.loads((tmp_path / "out" / "agreement.json").read_text())
    assert report["overall"]["judged_success"] == 0  # 0.42 < the 0.5 threshold: no success labeled
