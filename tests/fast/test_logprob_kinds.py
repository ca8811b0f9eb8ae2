"""The vLLM engine's gate between the two kinds of log-probability requests (engines/vllm/engine.py,
`_LogprobKinds`): pure asyncio, fast tier; tests/test_chat.py sends both kinds at once to vLLM."""

from __future__ import annotations

import asyncio

from reward_server.engines.vllm.engine import _NAMED_IDS, _TOP_K, _LogprobKinds


def test_logprob_kinds_never_share_the_engine_and_a_waiting_kind_goes_next():
    """Requests naming token ids (logprob scores) and top-k requests (chat top_logprobs) are never
    in vLLM at once; a kind that waits is let in before new arrivals of the running kind, so a
    stream of scoring requests cannot starve a chat request (or the other way round)."""

    async def scenario() -> list[str]:
        gate = _LogprobKinds()
        order: list[str] = []
        active = {_NAMED_IDS: 0, _TOP_K: 0}

        async def request(name: str, kind: int, hold_s: float) -> None:
            await gate.enter(kind)
            active[kind] += 1
            assert active[1 - kind] == 0, "both kinds in the engine at once"
            order.append(name)
            await asyncio.sleep(hold_s)
            active[kind] -= 1
            await gate.leave(kind)

        first = asyncio.create_task(request("score-1", _NAMED_IDS, 0.05))
        await asyncio.sleep(0.01)
        chat = asyncio.create_task(request("chat", _TOP_K, 0.01))
        await asyncio.sleep(0.01)
        later = asyncio.create_task(request("score-2", _NAMED_IDS, 0.01))
        await asyncio.gather(first, chat, later)
        return order

    assert asyncio.run(scenario()) == ["score-1", "chat", "score-2"]
