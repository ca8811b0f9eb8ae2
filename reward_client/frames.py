"""How a judge model wants its frames: grid, temporal grouping, pixel bounds, and which to pick.

One `FrameSpec` is owned by the server's scoring profile (it knows its model) and the same
rules run on both sides: the env's episode buffer picks frames with `pick_steps`, and the
server's decoder picks them from a video with the same function, so a request sent as raw
frames and one sent as an MP4 of the whole episode show the model the same steps.
Numpy only: this module is imported inside RL env workers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


class FrameError(ValueError):
    """Frames that no model could use (none at all, an absurd aspect ratio)."""


@dataclass(frozen=True)
class FrameSpec:
    """The frame layout of a Qwen2.5-VL-style model (the defaults are Qwen2.5-VL's).

    pixel_factor: frame sides are multiples of it (patch 14 x spatial merge 2 = 28).
    temporal_factor: frames are grouped in this many per temporal patch (2): counts are multiples.
    min_pixels / max_aspect_ratio: bounds the model's processor enforces.
    """

    pixel_factor: int = 28
    temporal_factor: int = 2
    min_pixels: int = 56 * 56
    max_aspect_ratio: float = 200.0

    def frame_count(self, requested: int, available: int | None = None) -> int:
        """How many frames a request for `requested` sends: a multiple of temporal_factor, at
        least one group; never more than `available` except to complete the last group (padding)."""
        f = self.temporal_factor
        wanted = max(f, -(-requested // f) * f)
        if available is None or wanted <= available:
            return wanted
        if available < 1:
            raise FrameError("the video has no frames")
        return -(-available // f) * f

    def pick_steps(self, available: int, requested: int) -> list[int]:
        """Indices into `available` frames, spread evenly with first and last included; a short
        video repeats its last frame to fill the count (success shows at the end)."""
        if available < 1:
            raise FrameError("the video has no frames")
        count = self.frame_count(requested, available)
        if count >= available:
            return list(range(available)) + [available - 1] * (count - available)
        return [round(i * (available - 1) / (count - 1)) for i in range(count)]

    def fit_size(self, height: int, width: int, max_pixels: int) -> tuple[int, int]:
        """(h, w) rounded to the pixel grid with h*w within [min_pixels, max_pixels], aspect kept."""
        if min(height, width) < 1:
            raise FrameError(f"frame size {width}x{height} is empty")
        if max(height, width) / min(height, width) > self.max_aspect_ratio:
            raise FrameError(f"frame aspect ratio {width}x{height} is more extreme than {self.max_aspect_ratio:g}:1")
        f = self.pixel_factor
        min_pixels = min(self.min_pixels, max_pixels)
        h = max(f, round(height / f) * f)
        w = max(f, round(width / f) * f)
        if h * w > max_pixels:
            beta = math.sqrt(height * width / max_pixels)
            h = max(f, math.floor(height / beta / f) * f)
            w = max(f, math.floor(width / beta / f) * f)
        elif h * w < min_pixels:
            beta = math.sqrt(min_pixels / (height * width))
            h = math.ceil(height * beta / f) * f
            w = math.ceil(width * beta / f) * f
        return h, w

    def to_dict(self) -> dict:
        return asdict(self)


QWEN2_5_VL = FrameSpec()
