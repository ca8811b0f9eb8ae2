"""How a judge model wants its frames: grid, temporal grouping, pixel bounds, and which to pick.

One `FrameSpec` is owned by the server's scoring profile (it knows its model) and the same
rules run on both sides: the env's episode buffer picks frames with `pick_steps`, and the
server's decoder picks them from a video with the same function, so a request sent as raw
frames and one sent as an MP4 of the whole episode show the model the same steps.
Numpy only: this module is imported inside RL env workers.

It also owns the one rule for pixel values (`as_uint8`): frames are uint8; float frames in [0, 1]
(what RLinf's earlier reward-data collector stores) become round(x * 255); any other dtype or
range is refused with its dtype and range named, on every path that sends or buffers frames.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


class FrameError(ValueError):
    """Frames that no model could use (none at all, an absurd aspect ratio)."""


def _value_range(arr: np.ndarray) -> str:
    if not arr.size or arr.dtype.kind not in "biuf":
        return "no values" if not arr.size else "values that are not numbers"
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        return "non-finite values"
    return f"values in [{arr.min()}, {arr.max()}]"


def as_uint8(frames, what: str = "frames") -> np.ndarray:
    """Frames as uint8 by the one documented rule: uint8 as they are (no copy); floating point
    in [0, 1] as round(x * 255); anything else (other dtypes, floats outside [0, 1], NaN) a
    FrameError naming the dtype and the range found. Never a silent cast: int16 300 is not 44,
    and float frames in [0, 1] are not an all-black video."""
    arr = np.asarray(frames)
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype.kind == "f" and arr.size and np.isfinite(arr).all() and arr.min() >= 0.0 and arr.max() <= 1.0:
        return np.rint(arr * 255.0).astype(np.uint8)
    raise FrameError(
        f"{what} are {arr.dtype} with {_value_range(arr)}; frames must be uint8 (0..255), or float in [0, 1] "
        "(sent as round(x * 255))"
    )


@dataclass(frozen=True)
class FrameSpec:
    """The frame layout of a Qwen-VL-style model (the defaults are Qwen2.5-VL's; QWEN3_VL below).

    pixel_factor: frame sides are multiples of it (patch 14 x spatial merge 2 = 28; 32 on Qwen3-VL).
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
# Qwen3-VL: patch 16 x spatial merge 2 = 32; frames in temporal pairs; 2 x 2 merged patches at least
QWEN3_VL = FrameSpec(pixel_factor=32, temporal_factor=2, min_pixels=64 * 64)


def _cubic_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices [n_out, 4] and weights [n_out, 4] of bicubic resampling (a = -0.75, pixel
    centres aligned, edges replicated): the kernel OpenCV's INTER_CUBIC uses, which the server
    resizes with."""
    a = -0.75
    x = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    x0 = np.floor(x)
    t = (x - x0)[:, None]
    d = np.abs(t - np.arange(-1, 3)[None, :])  # distance to the 4 taps x0-1 .. x0+2
    w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a)
    idx = np.clip(x0[:, None].astype(np.int64) + np.arange(-1, 3)[None, :], 0, n_in - 1)
    return idx, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def _resize(frames: np.ndarray, h: int, w: int) -> np.ndarray:
    try:
        import cv2  # the server's own resize: frames come out exactly as it would make them
    except ImportError:
        cv2 = None
    if cv2 is not None:
        out = np.empty((frames.shape[0], h, w, frames.shape[3]), dtype=np.uint8)
        for i, frame in enumerate(frames):
            out[i] = cv2.resize(np.ascontiguousarray(frame), (w, h), interpolation=cv2.INTER_CUBIC)
        return out
    rows, row_w = _cubic_taps(frames.shape[1], h)
    cols, col_w = _cubic_taps(frames.shape[2], w)
    out = np.empty((frames.shape[0], h, w, frames.shape[3]), dtype=np.uint8)
    for i, frame in enumerate(frames):  # one frame at a time: bounded float buffers
        x = np.einsum("hkwc,hk->hwc", frame[rows].astype(np.float32), row_w)
        x = np.einsum("hwkc,wk->hwc", x[:, cols], col_w)
        out[i] = np.clip(np.rint(x), 0, 255)
    return out


def to_grid(
    frames: np.ndarray, patch: int = 28, max_pixels: int = 256 * 28 * 28, spec: FrameSpec | None = None
) -> np.ndarray:
    """Frames [T, H, W, 3] uint8 resized onto the model's grid in the sender (256x256 -> 252x252
    for Qwen2.5-VL), so the server resizes nothing: the size the server would pick for
    `max_pixels` (FrameSpec.fit_size), by the same bicubic resampling (OpenCV's when installed,
    else the same kernel in numpy, within a grey level of it). Frames already on the grid are
    returned as they are. Also 3% fewer bytes to send at 256 -> 252. Float frames in [0, 1]
    are converted first (`as_uint8`); other dtypes are refused."""
    frames = as_uint8(frames)
    if frames.ndim != 4:
        raise FrameError(f"frames must be uint8 [T, H, W, C], got {frames.dtype} {list(frames.shape)}")
    spec = spec or FrameSpec(pixel_factor=patch)
    _, height, width, _ = frames.shape
    h, w = spec.fit_size(height, width, max_pixels)
    if (h, w) == (height, width):
        return frames
    return _resize(frames, h, w)
