"""No batch size the hook can produce is refused (fast tier: the real app on the fake engine over
real HTTP, the real clients and RLinf hook).

The server advertises its limits in /health; the client cuts a batch into requests within them on
every transport: a JSON body within --decode-memory-mb / 16 (here 256 / 16 = 16 MiB: the scaled
form of 64 LIBERO episodes x 16 frames of 256x256 inline, 268,452,142 bytes against 268,435,456),
a raw batch within --max-body-mb (20), at most --max-queue episodes per request (video_path). A client
that does not know the limits halves a body the server refuses as too large."""

from __future__ import annotations

import numpy as np
import pytest

from reward_client.client import RetryPolicy, RewardClient
from reward_client.rlinf.hook import RewardModelConfig, VLMRewardHook
from reward_protocol.score import InlineFrames, ScoreOptions, ScoreRequest
from tests.helpers.servers import InProcessServer, get

MIB = 1024 * 1024
N = 8  # episodes of 16 frames of 256x256: 3 MiB each as bytes, 4 MiB as base64 (32 MiB in one JSON body)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    videos = tmp_path_factory.mktemp("episodes")
    with InProcessServer(decode_memory_mb=256, max_body_mb=20, max_queue=3, video_roots=[str(videos)]) as s:
        s.video_dir = videos
        yield s


def episode(i: int) -> np.ndarray:
    return np.full((16, 256, 256, 3), 10 * (i + 1), np.uint8)


def expected(n: int = N) -> list[float]:
    return [round(10 * (i + 1) / 255 * 100) / 100 for i in range(n)]  # the fake engine's brightness score


def test_health_advertises_the_limits(server):
    limits = get(f"{server.url}/health").json()["limits"]
    assert limits == {
        "max_json_body_bytes": 16 * MIB,  # --decode-memory-mb 256 / 16
        "max_raw_body_bytes": 20 * MIB,  # --max-body-mb (8 episodes: 24 MiB)
        "max_batch_items": 3,  # --max-queue
        "request_timeout_s": 600.0,
    }


@pytest.mark.parametrize("learn", ["health", "refusal"])
def test_a_json_batch_over_the_limit_is_sent_in_parts(server, learn):
    client = RewardClient(server.url, RetryPolicy(deadline_s=60))
    if learn == "refusal":  # limits unknown: the 413 is answered by halving
        client._limits_asked = True
    requests = [ScoreRequest(task_text="t", nframes=16, frames=InlineFrames.from_array(episode(i))) for i in range(N)]
    items = client.score_batch(requests)
    assert [i.response.score for i in items] == expected()
    assert client.split_requests >= 2


def test_a_raw_batch_over_the_limit_is_sent_in_parts(server):
    client = RewardClient(server.url, RetryPolicy(deadline_s=60))
    items = client.score_episodes([(ScoreOptions(task_text="t", nframes=16), episode(i)) for i in range(N)])
    assert [i.response.score for i in items] == expected()
    assert client.limits is not None and client.split_requests >= 2


@pytest.mark.parametrize("transport", ["inline", "raw", "video_path"])
def test_the_hook_is_never_refused_for_its_batch_size(server, transport):
    config = RewardModelConfig(
        enable=True,
        url=server.url,
        transport=transport,
        video_dir=str(server.video_dir),
        nframes=16,
        wait_ready_s=30,
        fail_on_request_error=True,
    )
    h = VLMRewardHook(config, num_envs=N)
    frame = lambda t: np.stack([episode(i)[0] for i in range(N)])  # noqa: E731
    h.on_reset(None, frame(0))
    for t in range(1, 17):
        values = h.on_step(frame(t), ["open the drawer"] * N, np.zeros(N, bool), np.full(N, t == 16))
    tolerance = 0.02 if transport == "video_path" else 0
    assert values == pytest.approx(expected(), abs=tolerance)
    assert h.counts["fallbacks"] == 0 and h.counts["request_errors"] == 0
    assert h.client.split_requests >= 2  # 8 episodes, at most 3 per request
