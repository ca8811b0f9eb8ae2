"""One rule for pixel values on every path (fast tier): uint8 as is, float in [0, 1] as
round(x * 255), anything else a FrameError naming the dtype and the range found
(reward_protocol.frames.as_uint8). The paths: inline frames, raw batches, MP4 writing (video_path),
the hook's episode buffers and to_grid on the client; inline and raw frames in the server (the
real app on the fake engine, whose score is the last frame's brightness)."""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest

from reward_client.rlinf.hook import RewardModelConfig, VLMRewardHook
from reward_protocol import raw_batch
from reward_protocol.frames import FrameError, as_uint8, to_grid
from reward_protocol.score import InlineFrames, ScoreOptions
from tests.helpers.servers import InProcessServer, post

HALF = np.full((4, 56, 56, 3), 0.5, np.float32)  # what RLinf's earlier reward-data collector stores
REFUSED = [
    (np.full((4, 28, 28, 3), 300, np.int16), r"int16 with values in \[300, 300\]"),
    (np.full((4, 28, 28, 3), 1.5, np.float32), r"float32 with values in \[1.5, 1.5\]"),
    (np.full((4, 28, 28, 3), np.nan, np.float64), "float64 with non-finite values"),
    (np.full((4, 28, 28, 3), 7, np.int64), r"int64 with values in \[7, 7\]"),
]


@pytest.fixture(scope="module")
def server():
    with InProcessServer() as s:
        yield s


def test_the_rule():
    assert as_uint8(np.array([0.0, 0.2, 0.5, 1.0])).tolist() == [0, 51, 128, 255]  # round(x * 255)
    frames = np.arange(12, dtype=np.uint8)
    assert as_uint8(frames) is frames  # uint8 is not copied
    for frames, named in REFUSED:
        with pytest.raises(FrameError, match=named):
            as_uint8(frames)


def test_every_client_path_converts_floats_and_refuses_the_rest(tmp_path):
    av = pytest.importorskip("av")
    from reward_client.video_io import write_mp4

    as_bytes = np.full(HALF.shape, 128, np.uint8)
    assert InlineFrames.from_array(HALF) == InlineFrames.from_array(as_bytes)
    options = ScoreOptions(task_text="t", nframes=4)
    assert raw_batch.encode([(options, HALF)]).tobytes() == raw_batch.encode([(options, as_bytes)]).tobytes()
    assert np.array_equal(to_grid(HALF), as_bytes)
    with av.open(write_mp4(HALF, tmp_path / "half.mp4")) as video:
        assert abs(int(np.median(next(video.decode(video=0)).to_ndarray(format="rgb24"))) - 128) <= 2
    for frames, named in REFUSED:
        for path in (
            InlineFrames.from_array,
            lambda f: raw_batch.encode([(options, f)]),
            to_grid,
            lambda f: write_mp4(f, tmp_path / "refused.mp4"),
        ):
            with pytest.raises(FrameError, match=named):
                path(frames)


def run_hook(server, frame: np.ndarray, n: int = 2) -> np.ndarray:
    config = RewardModelConfig(enable=True, url=server.url, nframes=4, wait_ready_s=30)
    h = VLMRewardHook(config, num_envs=n)
    h.on_reset(None, np.stack([frame] * n))
    for t in range(1, 4):
        values = h.on_step(np.stack([frame] * n), ["open the drawer"] * n, np.zeros(n, bool), np.full(n, t == 3))
    return values


def test_float_frames_reach_the_judge_as_their_brightness_through_the_hook(server):
    # before: the buffers cast 0.5 to 0 and the judge scored an all-black video (0.0, parse ok)
    assert run_hook(server, HALF[0]).tolist() == [round(128 / 255 * 100) / 100] * 2
    with pytest.raises(FrameError, match="int16 with values in"):
        run_hook(server, np.full((28, 28, 3), 300, np.int16))


def test_the_server_names_wide_pixels_in_inline_frames_and_raw_batches(server):
    wide = np.full((2, 28, 28, 3), 0.5, np.float32)
    frames = {"shape": list(wide.shape), "data_b64": base64.b64encode(wide.tobytes()).decode()}
    r = post(f"{server.url}/score", json={"task_text": "t", "frames": frames})
    assert r.status_code in (400, 422) and "float32/int32 pixels?" in r.text, r.text
    header = json.dumps({"requests": [{"task_text": "t", "frames": {"shape": list(wide.shape), "offset": 0}}]})
    body = struct.pack("<4sI", raw_batch.MAGIC, len(header)) + header.encode() + wide.tobytes()
    r = post(f"{server.url}/score/batch", content=body, headers={"content-type": raw_batch.CONTENT_TYPE})
    assert r.status_code in (400, 422) and "float32/int32 pixels?" in r.text, r.text


@pytest.mark.parametrize("times", [1.5, 2, 3, 4, 5, 8])
def test_a_raw_payload_longer_than_its_frames_is_refused_whatever_the_multiple(server, times):
    """Issue 58 class 10: before, 2x/4x/8x the named bytes were refused ("float16 pixels?") and
    3x or 5x scored the first third and ignored the rest. One rule: the payload ends where its
    last region ends; the hint only where a wider dtype would explain the length."""
    frames = np.full((2, 28, 28, 3), 7, np.uint8)
    header = json.dumps({"requests": [{"task_text": "t", "frames": {"shape": list(frames.shape), "offset": 0}}]})
    payload = np.resize(frames.ravel(), int(frames.size * times)).tobytes()
    body = struct.pack("<4sI", raw_batch.MAGIC, len(header)) + header.encode() + payload
    r = post(f"{server.url}/score/batch", content=body, headers={"content-type": raw_batch.CONTENT_TYPE})
    assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request", r.text
    message = r.json()["error"]["message"]
    assert f"{len(payload) - frames.size} bytes no frames region names" in message, message
    assert ("pixels?" in message) == (times in (2, 4, 8)), message
    exact = struct.pack("<4sI", raw_batch.MAGIC, len(header)) + header.encode() + frames.tobytes()
    r = post(f"{server.url}/score/batch", content=exact, headers={"content-type": raw_batch.CONTENT_TYPE})
    assert r.status_code == 200 and r.json()["results"][0]["response"]["score"] is not None, r.text
