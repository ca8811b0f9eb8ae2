"""The RLinf hook against the real app on the fake engine (fast tier): every transport carries
the episode's frames to the model, and an episode the server refuses is a request error, never a
silent fallback unless the config asks for one."""

from __future__ import annotations

import numpy as np
import pytest

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.hook import VLMRewardHook
from reward_server.media.video import fit_frames
from tests.helpers.servers import InProcessServer

N = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    videos = tmp_path_factory.mktemp("episodes")
    with InProcessServer(video_roots=[str(videos)], engine_option=["split_words=Yes"]) as s:
        s.video_dir = videos
        yield s


def run_episode(h: VLMRewardHook, steps: int = 9) -> np.ndarray:
    """Envs whose frames brighten with the step; all end (truncate) at the last step."""
    frame = lambda t: np.full((N, 56, 56, 3), 20 * t, np.uint8)  # noqa: E731
    h.on_reset(None, frame(0))
    for t in range(1, steps + 1):
        values = h.on_step(frame(t), ["put the bowl on the plate"] * N, np.zeros(N, bool), np.full(N, t == steps))
    return values


@pytest.mark.parametrize("transport", ["raw", "inline", "video_path"])
def test_every_transport_shows_the_model_the_episode(server, transport):
    config = RewardModelConfig(
        enable=True, url=server.url, transport=transport, video_dir=str(server.video_dir), nframes=4, wait_ready_s=30
    )
    h = VLMRewardHook(config, num_envs=N)
    seen = len(server.engine.seen)
    values = run_episode(h)
    assert h.counts["batches"] == 1 and h.counts["fallbacks"] == 0
    # the fake engine answers the last frame's brightness: 180/255 of 100, parsed as a percentage
    assert values == pytest.approx([round(180 / 255 * 100) / 100] * N, abs=0.02 if transport == "video_path" else 0)
    videos = [r.video for r in server.engine.seen[seen:]]
    assert len(videos) == N
    steps = h.buffers.steps(0)  # the bounded buffer's picks: the exact steps, or the nearest it kept
    assert steps[0] == 0 and steps[-1] == 9 and len(steps) == 4
    expected = fit_frames(np.stack([np.full((56, 56, 3), 20 * t, np.uint8) for t in steps]), 200704)
    for video in videos:
        tolerance = 3 if transport == "video_path" else 0  # H.264 in the MP4 transport
        assert np.abs(video.astype(int) - expected.astype(int)).max() <= tolerance
    assert not list(server.video_dir.glob("*.mp4"))  # MP4s written for the request are removed


def test_keep_videos_writes_what_the_judge_saw_with_the_raw_transport(server, tmp_path):
    config = RewardModelConfig(enable=True, url=server.url, keep_videos=True, video_dir=str(tmp_path), wait_ready_s=30)
    run_episode(VLMRewardHook(config, num_envs=N))
    assert len(list(tmp_path.glob("*_env*.mp4"))) == N


def test_an_episode_the_server_refuses_stops_training_unless_a_fallback_is_asked(server):
    # this checkpoint's tokenizer splits "Yes": logprob scoring is refused per episode (400)
    config = RewardModelConfig(enable=True, url=server.url, score_mode="logprob", wait_ready_s=30)
    with pytest.raises(RuntimeError, match=r"refused 3 of 3 episodes.*unsupported_option"):
        run_episode(VLMRewardHook(config, num_envs=N))
    lenient = config.model_copy(update={"fail_on_request_error": False})
    h = VLMRewardHook(lenient, num_envs=N)
    values = run_episode(h)
    assert values.tolist() == [0.0] * N
    assert h.counts["fallbacks"] == N and h.counts["request_errors"] == 1
    assert h.episode_info()["vlm_fallback"].tolist() == [1.0] * N


def test_to_grid_sends_frames_on_the_model_grid_and_the_server_resizes_nothing(server, monkeypatch):
    import reward_server.media.decoding as decoding

    arrived = []
    real_fit = decoding.fit_frames
    monkeypatch.setattr(decoding, "fit_frames", lambda f, *a, **k: arrived.append(f.shape) or real_fit(f, *a, **k))
    config = RewardModelConfig(enable=True, url=server.url, nframes=4, wait_ready_s=30, to_grid=True)
    h = VLMRewardHook(config, num_envs=N)
    seen = len(server.engine.seen)
    frame = lambda t: np.random.default_rng(t).integers(0, 256, (N, 64, 64, 3), dtype=np.uint8)  # noqa: E731
    h.on_reset(None, frame(0))
    for t in range(1, 4):
        h.on_step(frame(t), ["put the bowl on the plate"] * N, np.zeros(N, bool), np.full(N, t == 3))
    assert arrived == [(4, 56, 56, 3)] * N  # 64 -> 56 in the env worker: already on the grid at the server
    # what the server would have made of each env's frames (episodes reach the engine in any order)
    expected = [fit_frames(np.stack([frame(t)[e] for t in h.buffers.steps(e)]), 200704) for e in range(N)]
    got = [r.video for r in server.engine.seen[seen:]]
    assert len(got) == N and all(any(np.array_equal(v, x) for x in expected) for v in got)
