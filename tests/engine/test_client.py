"""The client against a real engine (vLLM, transformers): retries while the server starts, no retry
of a refusal, the async client, replicas sharing a batch and taking over from a dead one, data
parallelism."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient, RewardRequestError
from reward_protocol.score import InlineFrames, ScoreRequest
from reward_tools.launch import ServerProcess, free_port
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import CPU_PRESET

TASK = "open the top drawer and put the bowl inside"


def request(**kw) -> ScoreRequest:
    return ScoreRequest(task_text=TASK, frames=InlineFrames.from_array(episode_frames(12)), **kw)


def test_requests_sent_while_the_server_starts_are_retried_until_it_is_ready(tiny_checkpoint, tmp_path):
    port = free_port()
    client = RewardClient(f"http://127.0.0.1:{port}", RetryPolicy(deadline_s=300, backoff_max_s=2))
    server = ServerProcess(
        ["--config", str(CPU_PRESET), "--engine", "hf", "--model-path", tiny_checkpoint],
        port=port,
        log_path=tmp_path / "server.log",
    )
    with server:
        response = client.score(request(backend_kwargs={"score_mode": "logprob"}))
        assert 0.0 <= response.score <= 1.0
        assert client.attempts > 1  # connection refused / 503 loading came first
        assert client.wait_until_ready(10).status == "ok"


def test_a_refused_request_is_not_retried(hf_server):
    client = RewardClient(hf_server.url)
    with pytest.raises(RewardRequestError) as info:
        client.score(request(backend="PRIMO-R1"))
    assert info.value.status == 400 and info.value.error_type == "bad_request"
    assert client.attempts == 1


def test_async_client_scores_and_batches(hf_server):
    async def go():
        client = AsyncRewardClient(hf_server.url)
        try:
            await client.wait_until_ready(30)
            one = await client.score(request(backend_kwargs={"score_mode": "logprob"}))
            many = await client.score_batch([request(), request(nframes=4)])
            return one, many
        finally:
            await client.aclose()

    one, many = asyncio.run(go())
    assert one.parse_status.value == "logprob"
    assert [item.index for item in many] == [0, 1] and many[1].response.nframes == 4


def test_replicas_share_a_batch_and_take_over_from_a_dead_one(tiny_checkpoint, tmp_path):
    servers = []
    for name in "ab":
        s = ServerProcess(
            ["--config", str(CPU_PRESET), "--engine", "hf", "--model-path", tiny_checkpoint],
            log_path=tmp_path / f"{name}.log",
        )
        servers.append(s.start())
    try:
        for s in servers:
            s.wait_ready(300)
        client = RewardClient([s.url for s in servers], RetryPolicy(deadline_s=120, backoff_max_s=1))
        before = [httpx.get(f"{s.url}/stats").json()["requests"] for s in servers]
        items = client.score_batch([request(request_id=str(i)) for i in range(6)])
        assert [item.index for item in items] == list(range(6))
        assert [item.response.request_id for item in items] == [str(i) for i in range(6)]  # order kept
        after = [httpx.get(f"{s.url}/stats").json()["requests"] for s in servers]
        assert [x - y for x, y in zip(after, before, strict=True)] == [3, 3]  # split across replicas
        servers[0].stop()  # one replica dies
        for _ in range(3):
            assert client.score(request(backend_kwargs={"score_mode": "logprob"})).parse_status.value == "logprob"
        items = client.score_batch([request() for _ in range(4)])
        assert len(items) == 4 and all(item.response is not None for item in items)
        assert client.wait_until_ready(10).status == "ok"
    finally:
        for s in servers:
            s.stop()


def test_data_parallel_size_reaches_vllm_and_is_refused_by_transformers(tiny_checkpoint):
    from reward_server.engines import EngineConfig
    from reward_server.engines.hf_engine import HFEngine
    from reward_server.engines.vllm.engine import VllmEngine

    config = EngineConfig(model_path=tiny_checkpoint, data_parallel_size=2, tensor_parallel_size=2)
    kwargs = VllmEngine(config).engine_kwargs()
    assert kwargs["data_parallel_size"] == 2 and kwargs["tensor_parallel_size"] == 2
    with pytest.raises(ValueError, match="use --engine vllm"):
        HFEngine(config).load()
