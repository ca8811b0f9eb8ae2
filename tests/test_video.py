"""Frame rules every engine depends on: counts Qwen2.5-VL accepts, sizes on its grid, confinement."""

from __future__ import annotations

import os

import numpy as np
import pytest

from reward_client.video_io import encode_mp4, write_mp4
from reward_server.video import (
    PathNotAllowed,
    VideoError,
    decode_b64_video,
    decode_video,
    normalize_nframes,
    prepare_frames,
    resolve_video_path,
    sample_indices,
    smart_size,
)


@pytest.mark.parametrize(
    ("requested", "available", "expected"),
    [
        (16, 512, 16),
        (15, 512, 16),  # odd counts round up to the next pair
        (1, 512, 2),
        (16, 9, 10),  # all 9 frames, the last repeated once
        (16, 1, 2),
        (3, 3, 4),  # qwen-vl-utils raised here in the seed (nframes=min(3, 3) is odd)
        (2, 2, 2),
    ],
)
def test_normalize_nframes_is_even_and_at_least_two(requested, available, expected):
    n = normalize_nframes(requested, available)
    assert n == expected and n % 2 == 0 and n >= 2


def test_sample_indices_spread_over_the_episode_and_keep_the_last_frame():
    idx = sample_indices(512, 16)
    assert idx[0] == 0 and idx[-1] == 511
    assert idx == sorted(idx) and len(set(idx)) == 16
    gaps = np.diff(idx)
    assert gaps.max() - gaps.min() <= 1


def test_short_episodes_are_padded_with_their_last_frame():
    assert sample_indices(5, 16) == [0, 1, 2, 3, 4, 4]
    assert sample_indices(1, 4) == [0, 0]


def test_zero_frames_is_an_error():
    with pytest.raises(VideoError, match="no frames"):
        normalize_nframes(16, 0)


@pytest.mark.parametrize(
    ("h", "w", "max_pixels", "expected"),
    [
        (256, 256, 200704, (252, 252)),  # LIBERO frames: rounded onto the 28-pixel grid
        (256, 256, 28 * 28 * 16, (112, 112)),  # shrunk under max_pixels, aspect kept
        (480, 640, 200704, (364, 504)),
        (20, 20, 200704, (56, 56)),  # tiny frames grow to the minimum
    ],
)
def test_smart_size(h, w, max_pixels, expected):
    out = smart_size(h, w, max_pixels)
    assert out == expected
    assert out[0] % 28 == 0 and out[1] % 28 == 0 and out[0] * out[1] <= max(max_pixels, 56 * 56)


def test_prepare_frames_honours_nframes_and_max_pixels():
    frames = np.random.default_rng(0).integers(0, 255, (37, 256, 256, 3), dtype=np.uint8)
    out = prepare_frames(frames, nframes=7, max_pixels=28 * 28 * 16)
    assert out.shape == (8, 112, 112, 3) and out.dtype == np.uint8


def test_frames_already_on_the_grid_are_not_resampled():
    frames = np.random.default_rng(1).integers(0, 255, (4, 56, 84, 3), dtype=np.uint8)
    np.testing.assert_array_equal(prepare_frames(frames, 4, 200704), frames)


def test_mp4_round_trip_keeps_count_and_size(tmp_path):
    frames = np.zeros((12, 64, 48, 3), dtype=np.uint8)
    frames[:, :, :, 0] = np.arange(12, dtype=np.uint8)[:, None, None] * 20
    path = write_mp4(frames, tmp_path / "ep.mp4", fps=10)
    decoded = decode_video(path)
    assert len(decoded) == 12 and decoded[0].shape == (64, 48, 3)
    assert abs(int(decoded[-1][..., 0].mean()) - 220) < 8  # content survives, order kept


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"this is not a video", "not a readable video"),
        (b"", "empty"),
    ],
)
def test_bad_video_bytes_give_clear_errors(payload, message):
    import base64

    with pytest.raises(VideoError, match=message):
        decode_b64_video(base64.b64encode(payload).decode())


def test_truncated_mp4_is_an_error_not_a_crash():
    data = encode_mp4(np.zeros((10, 32, 32, 3), dtype=np.uint8))
    with pytest.raises(VideoError):
        decode_video(data[: len(data) // 3])


def test_video_path_confined_to_roots(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    inside = root / "ep.mp4"
    inside.write_bytes(b"x")
    outside = tmp_path / "secret.mp4"
    outside.write_bytes(b"x")
    assert resolve_video_path(str(inside), [root]) == inside.resolve()
    with pytest.raises(PathNotAllowed):
        resolve_video_path(str(root / ".." / "secret.mp4"), [root])
    link = root / "link.mp4"
    os.symlink(outside, link)
    with pytest.raises(PathNotAllowed):
        resolve_video_path(str(link), [root])
    with pytest.raises(VideoError, match="does not exist"):
        resolve_video_path(str(root / "missing.mp4"), [root])
    with pytest.raises(PathNotAllowed) as info:
        resolve_video_path("/etc/passwd", [root])
    assert str(root) not in str(info.value)  # the server's roots are not revealed
