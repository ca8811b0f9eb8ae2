"""`reward_protocol.frames.to_grid`: the client puts frames on the model's grid exactly as the server
would, so the server resizes nothing (issue: frames at 252 instead of 256)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from reward_protocol.frames import FrameError, to_grid
from reward_server.media.video import fit_frames
from tests.helpers.episodes import episode_frames


@pytest.mark.parametrize(("h", "w", "max_pixels"), [(256, 256, 200704), (480, 640, 200704), (100, 60, 200704)])
def test_to_grid_matches_the_servers_resize(h, w, max_pixels):
    frames = np.random.default_rng(h + w).integers(0, 256, (4, h, w, 3), dtype=np.uint8)
    out = to_grid(frames, max_pixels=max_pixels)
    assert out.shape[1] % 28 == 0 and out.shape[2] % 28 == 0
    np.testing.assert_array_equal(out, fit_frames(frames, max_pixels))
    assert to_grid(out, max_pixels=max_pixels) is out  # already on the grid: untouched


def test_to_grid_256_gives_252_and_other_patches():
    frames = episode_frames(4, 256)
    assert to_grid(frames).shape == (4, 252, 252, 3)
    assert to_grid(frames, patch=32).shape == (4, 256, 256, 3)
    with pytest.raises(FrameError, match="uint8"):
        to_grid(frames.astype(np.float32))


def test_without_opencv_the_numpy_kernel_is_within_a_grey_level(monkeypatch):
    frames = episode_frames(3, 256)
    with_cv2 = to_grid(frames)
    monkeypatch.setitem(sys.modules, "cv2", None)  # `import cv2` raises ImportError
    without = to_grid(frames)
    assert without.shape == with_cv2.shape
    assert np.abs(without.astype(int) - with_cv2.astype(int)).max() <= 1
