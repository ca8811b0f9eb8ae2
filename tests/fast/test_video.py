"""Frame rules every engine depends on (reward_protocol.frames.FrameSpec, shared by client and
server), and the decoder: exact picks from a stream, confinement, clear errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from reward_client.video_io import encode_mp4, write_mp4
from reward_protocol.frames import QWEN2_5_VL as SPEC
from reward_protocol.frames import FrameError
from reward_server.media.paths import FileNotFound, InvalidPath, PathNotAllowed, open_confined
from reward_server.media.video import VideoError, decode_frames, fit_frames, pick_frames

ROOTS_MAX = 1 << 30


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
    n = SPEC.frame_count(requested, available)
    assert n == expected and n % 2 == 0 and n >= 2


def test_sample_indices_spread_over_the_episode_and_keep_the_last_frame():
    idx = SPEC.pick_steps(512, 16)
    assert idx[0] == 0 and idx[-1] == 511
    assert idx == sorted(idx) and len(set(idx)) == 16
    gaps = np.diff(idx)
    assert gaps.max() - gaps.min() <= 1


def test_short_episodes_are_padded_with_their_last_frame():
    assert SPEC.pick_steps(5, 16) == [0, 1, 2, 3, 4, 4]
    assert SPEC.pick_steps(1, 4) == [0, 0]


def test_zero_frames_is_an_error():
    with pytest.raises(FrameError, match="no frames"):
        SPEC.pick_steps(0, 16)


@pytest.mark.parametrize(
    ("h", "w", "max_pixels", "expected"),
    [
        (256, 256, 200704, (252, 252)),  # LIBERO frames: rounded onto the 28-pixel grid
        (256, 256, 28 * 28 * 16, (112, 112)),  # shrunk under max_pixels, aspect kept
        (480, 640, 200704, (364, 504)),
        (20, 20, 200704, (56, 56)),  # tiny frames grow to the minimum
    ],
)
def test_fit_size(h, w, max_pixels, expected):
    out = SPEC.fit_size(h, w, max_pixels)
    assert out == expected
    assert out[0] % 28 == 0 and out[1] % 28 == 0 and out[0] * out[1] <= max(max_pixels, 56 * 56)


def test_pick_and_fit_honour_nframes_and_max_pixels():
    frames = np.random.default_rng(0).integers(0, 255, (37, 256, 256, 3), dtype=np.uint8)
    out = fit_frames(pick_frames(frames, 7), max_pixels=28 * 28 * 16)
    assert out.shape == (8, 112, 112, 3) and out.dtype == np.uint8


def test_frames_already_on_the_grid_are_not_resampled():
    frames = np.random.default_rng(1).integers(0, 255, (4, 56, 84, 3), dtype=np.uint8)
    np.testing.assert_array_equal(fit_frames(pick_frames(frames, 4), 200704), frames)


def test_decoder_picks_exactly_the_steps_the_spec_picks(tmp_path):
    frames = np.zeros((40, 64, 48, 3), dtype=np.uint8)
    frames[:] = (np.arange(40, dtype=np.uint8) * 6)[:, None, None, None]  # grey level = step (luma survives)
    path = write_mp4(frames, tmp_path / "ep.mp4", fps=10)
    with open(path, "rb") as fh:
        decoded = decode_frames(fh, nframes=6)
    assert decoded.shape == (6, 64, 48, 3)
    steps = [round(float(f.mean()) / 6) for f in decoded]
    assert steps == SPEC.pick_steps(40, 6) == [0, 8, 16, 23, 31, 39]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"this is not a video", "not a video container this server reads"),
        (b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 40, "not a readable video"),
    ],
)
def test_bad_video_bytes_give_clear_errors(payload, message):
    with pytest.raises(VideoError, match=message):
        decode_frames(payload, 4)


def test_truncated_mp4_is_an_error_not_a_crash():
    data = encode_mp4(np.zeros((10, 32, 32, 3), dtype=np.uint8))
    with pytest.raises(VideoError):
        decode_frames(data[: len(data) // 3], 4)


def test_video_path_confined_to_roots(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    inside = root / "ep.mp4"
    inside.write_bytes(b"x")
    outside = tmp_path / "secret.mp4"
    outside.write_bytes(b"x")
    with open_confined(str(inside), [root], ROOTS_MAX) as fh:
        assert fh.read() == b"x"
    with pytest.raises(PathNotAllowed):
        open_confined(str(root / ".." / "secret.mp4"), [root], ROOTS_MAX)
    link = root / "link.mp4"
    os.symlink(outside, link)
    with pytest.raises(PathNotAllowed):
        open_confined(str(link), [root], ROOTS_MAX)
    with pytest.raises(FileNotFound, match="does not exist"):
        open_confined(str(root / "missing.mp4"), [root], ROOTS_MAX)
    with pytest.raises(PathNotAllowed) as info:
        open_confined("/etc/passwd", [root], ROOTS_MAX)
    assert str(root) not in str(info.value)  # the server's roots are not revealed


def test_only_regular_files_are_opened(tmp_path):
    fifo = tmp_path / "fifo.mp4"
    os.mkfifo(fifo)
    with pytest.raises(InvalidPath, match="not a regular file"):
        open_confined(str(fifo), [tmp_path], ROOTS_MAX)  # returns at once: no writer is waited for
    with pytest.raises(InvalidPath, match="not a regular file"):
        open_confined(str(tmp_path), [tmp_path], ROOTS_MAX)
