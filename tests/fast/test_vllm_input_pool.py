"""The vLLM engine's input pool (engines/vllm_input_pool.py): a curve's leaders, then the points
whose items are all processed already, then the points with a tail of their own; first come,
first served within a rank or with `input_order=fifo`. Errors and cancellations reach the caller
as from a ThreadPoolExecutor, and a stopped pool runs nothing more."""

from __future__ import annotations

import asyncio
import threading

import pytest

from reward_client.protocol import BackendKwargs
from reward_server import cli
from reward_server.engines.vllm_curves import assign_clip_ids, chain_leaders, point_ranks
from reward_server.engines.vllm_input_pool import HITS, LEAD, OWN, InputPool, input_order
from reward_server.profiles import load_profile
from tests.helpers.episodes import TASK, ramp


def _held(pool: InputPool) -> threading.Event:
    """Keep the pool's only thread busy until the returned event is set."""
    release = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        release.wait(10)

    pool.submit(hold)
    assert started.wait(10)
    return release


def _order_of(order: str, jobs: list[tuple[str, int]]) -> list[str]:
    """The names of `jobs` (name, rank), submitted while the pool's thread is busy, in the order
    the pool ran them."""
    pool = InputPool(1, order)  # type: ignore[arg-type]
    ran: list[str] = []
    release = _held(pool)
    futures = [pool.submit_ranked(rank, ran.append, name) for name, rank in jobs]
    release.set()
    for future in futures:
        future.result(timeout=10)
    pool.shutdown()
    return ran


JOBS = [("tail-a", OWN), ("hit-a", HITS), ("leader-b", LEAD), ("hit-b", HITS), ("tail-b", OWN), ("single", LEAD)]


def test_ranked_takes_leaders_then_hits_then_own_items_each_first_come_first_served():
    assert _order_of("ranked", JOBS) == ["leader-b", "single", "hit-a", "hit-b", "tail-a", "tail-b"]


def test_fifo_takes_every_job_as_it_came():
    assert _order_of("fifo", JOBS) == [name for name, _ in JOBS]


def test_errors_reach_the_caller_and_the_thread_goes_on():
    pool = InputPool(1)

    def fails() -> None:
        raise KeyError("bad input")

    with pytest.raises(KeyError, match="bad input"):
        pool.submit_ranked(OWN, fails).result(timeout=10)
    assert pool.submit(lambda: 7).result(timeout=10) == 7
    pool.shutdown()


def test_a_job_cancelled_before_it_is_taken_never_runs():
    pool = InputPool(1)
    ran: list[str] = []
    release = _held(pool)
    dropped = pool.submit_ranked(LEAD, ran.append, "dropped")
    kept = pool.submit_ranked(OWN, ran.append, "kept")
    assert dropped.cancel()
    release.set()
    kept.result(timeout=10)
    assert ran == ["kept"]
    pool.shutdown()


def test_the_event_loop_awaits_it_ranked_or_through_run_in_executor():
    """How the engine uses it: asyncio.wrap_future(submit_ranked(...)), and run_in_executor (the
    benchmark scripts) at rank LEAD; cancelling the awaiting task skips a job not yet taken."""
    pool = InputPool(2)

    async def main() -> tuple[int, int, list[str]]:
        loop = asyncio.get_running_loop()
        ranked = await asyncio.wrap_future(pool.submit_ranked(HITS, sum, [1, 2]))
        plain = await loop.run_in_executor(pool, max, 4, 9)
        ran: list[str] = []
        gates = [_held_async(pool) for _ in range(2)]
        task = asyncio.ensure_future(asyncio.wrap_future(pool.submit_ranked(OWN, ran.append, "late")))
        await asyncio.sleep(0)
        task.cancel()
        for gate in gates:
            gate.set()
        await asyncio.wrap_future(pool.submit(ran.append, "after"))
        return ranked, plain, ran

    assert asyncio.run(main()) == (3, 9, ["after"])
    pool.shutdown()


def _held_async(pool: InputPool) -> threading.Event:
    release = threading.Event()
    pool.submit(release.wait, 10)
    return release


def test_shutdown_cancels_what_waits_or_runs_it_first():
    pool = InputPool(1)
    release = _held(pool)
    waiting = pool.submit_ranked(OWN, lambda: "ran")
    release.set()
    pool.shutdown(wait=True)  # the waiting job still runs
    assert waiting.result(timeout=0) == "ran"

    pool = InputPool(1)
    release = _held(pool)
    waiting = pool.submit_ranked(LEAD, lambda: "ran")
    pool.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)
    for thread in pool._threads:
        thread.join(10)
        assert not thread.is_alive()


def test_input_order_defaults_to_ranked_and_refuses_others_naming_what_is_allowed(capsys):
    assert input_order({}) == "ranked"
    assert input_order({"input_order": "FIFO"}) == "fifo"
    with pytest.raises(SystemExit) as info:
        cli.parse_settings(["--engine", "vllm", "--model-path", "m", "--engine-option", "input_order=lifo"])
    assert info.value.code == 2
    assert "input_order='lifo': allowed ranked or fifo" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least one thread"):
        InputPool(0)


def _curve(profile, curve_id: str) -> list:
    """A 16-point curve of 16 frames as the score route hands it to the engine: ids per point,
    item ids per curve."""
    requests = profile.build_curve(TASK, ramp(16), BackendKwargs(), "auto", 16)
    for k, request in enumerate(requests):
        request.request_id = f"{curve_id}-p{k}"
    assign_clip_ids(requests, curve_id)
    return requests


@pytest.mark.parametrize("backend", ["qwen2_5_vl_vllm", "PRIMO-R1"])
def test_a_curves_tails_rank_behind_its_hits(backend):
    """A 16-point curve of 16 frames, tail layout: the points ending on a whole frame pair show
    only the longest point's items (hits); each odd point has a tail of its own (and PRIMO-R1 its
    own last frame besides, so every one of its points has an item of its own). Shifted: every
    point shows a leader's items only."""
    requests = _curve(load_profile(backend), "c")
    leaders = chain_leaders(requests)
    ranks = point_ranks(leaders, requests)
    assert set(ranks) == {r.request_id for r in requests} - {r.request_id for r in leaders}
    for end, request in enumerate(requests, start=1):
        if request.request_id in ranks:
            expected = OWN if end % 2 or backend == "PRIMO-R1" else HITS
            assert ranks[request.request_id] == expected, end

    shifted = _curve(load_profile(backend, partial_groups="shifted"), "s")
    ranks = point_ranks(chain_leaders(shifted), shifted)
    assert len(ranks) == 14 and set(ranks.values()) == ({OWN} if backend == "PRIMO-R1" else {HITS})
