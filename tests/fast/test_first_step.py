"""An idle engine's first step gets a few episodes (engines/first_step.py), on real asyncio: the
gate holds processed requests only while the engine is idle and siblings are still processing,
never a lone request or a running batch, and never longer than its wait."""

from __future__ import annotations

import asyncio

import pytest

from reward_server.engines.first_step import FirstStepGather, GatherSettings, gather_settings


async def _request(gate: FirstStepGather, name: str, work_s: float, went: list[str]) -> None:
    async with gate.processing_input():
        await asyncio.sleep(work_s)  # the input's processing
    await gate.ready()
    went.append(name)


def test_a_lone_request_and_a_busy_engine_never_wait():
    async def scenario() -> None:
        gate = FirstStepGather(GatherSettings(batch=4, wait_ms=1000))
        went: list[str] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        await _request(gate, "alone", 0.0, went)
        assert went == ["alone"] and loop.time() - start < 0.5 and gate.stats.first_step_groups == 0
        # the engine now holds "alone": the others pass as soon as they are processed
        await asyncio.gather(_request(gate, "a", 0.01, went), _request(gate, "b", 0.02, went))
        assert went == ["alone", "a", "b"] and loop.time() - start < 0.5
        for _ in range(3):
            gate.done()
        assert gate.in_engine == 0

    asyncio.run(scenario())


def test_an_idle_engine_gets_the_first_requests_together_in_the_order_they_were_ready():
    async def scenario() -> None:
        gate = FirstStepGather(GatherSettings(batch=3, wait_ms=1000))
        went: list[str] = []
        tasks = [asyncio.ensure_future(_request(gate, f"r{i}", 0.01 * (i + 1), went)) for i in range(5)]
        await asyncio.sleep(0.035)  # r0-r2 processed: handed over together; r3, r4 pass when ready
        assert went == ["r0", "r1", "r2"] and gate.stats.first_step_groups == 1 and gate.stats.first_step_largest == 3
        await asyncio.gather(*tasks)
        assert went == ["r0", "r1", "r2", "r3", "r4"] and gate.in_engine == 5

    asyncio.run(scenario())


def test_the_held_go_when_nothing_else_is_processing_or_the_wait_is_over():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        # two requests, a batch of four: the second's end releases both (nothing else can join)
        gate = FirstStepGather(GatherSettings(batch=4, wait_ms=1000))
        went: list[str] = []
        start = loop.time()
        await asyncio.gather(_request(gate, "a", 0.0, went), _request(gate, "b", 0.05, went))
        assert went == ["a", "b"] and loop.time() - start < 0.5 and gate.stats.first_step_largest == 2
        # a slow sibling: the first waits only its 40 ms, then goes alone
        gate = FirstStepGather(GatherSettings(batch=4, wait_ms=40))
        went = []
        slow = asyncio.ensure_future(_request(gate, "slow", 0.3, went))
        start = loop.time()
        await _request(gate, "fast", 0.0, went)
        assert went == ["fast"] and 0.03 <= loop.time() - start < 0.25
        await slow  # the engine is busy with "fast": no wait
        assert went == ["fast", "slow"]

    asyncio.run(scenario())


def test_a_request_cancelled_while_held_is_not_counted_in_the_engine():
    async def scenario() -> None:
        gate = FirstStepGather(GatherSettings(batch=3, wait_ms=1000))
        went: list[str] = []
        held = asyncio.ensure_future(_request(gate, "gone", 0.0, went))
        other = asyncio.ensure_future(_request(gate, "other", 0.05, went))
        await asyncio.sleep(0.01)
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
        await other  # the last processing: it goes, alone
        assert went == ["other"] and gate.in_engine == 1 and gate.held == []

    asyncio.run(scenario())


def test_bad_settings_name_what_is_allowed():
    assert gather_settings({}, default_batch=1).batch == 1
    assert gather_settings({"first_step_batch": "4", "first_step_wait_ms": "20"}, 1) == GatherSettings(4, 20.0)
    for options in ({"first_step_batch": "0"}, {"first_step_batch": "many"}, {"first_step_wait_ms": "5000"}):
        with pytest.raises(ValueError, match="allowed"):
            gather_settings(options, default_batch=1)


def test_a_sibling_whose_processing_fails_releases_the_held():
    async def scenario() -> None:
        gate = FirstStepGather(GatherSettings(batch=3, wait_ms=1000))
        went: list[str] = []

        async def failing() -> None:
            async with gate.processing_input():
                await asyncio.sleep(0.03)
                raise ValueError("a bad input")

        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(_request(gate, "ok", 0.0, went), failing(), return_exceptions=True)
        assert went == ["ok"] and isinstance(results[1], ValueError) and loop.time() - start < 0.5
        assert gate.in_engine == 1 and gate.processing == 0

    asyncio.run(scenario())
