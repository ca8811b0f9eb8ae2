"""Episode video in, model-ready frames out: decode, confine paths, sample, resize.

Qwen2.5-VL groups video frames in temporal pairs and cuts frames into 14-pixel patches merged
2x2, so what reaches an engine is always an even number (>= 2) of frames whose sides are
multiples of 28. These rules are applied here once, for every engine.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from reward_client.protocol import InlineFrames

PIXEL_FACTOR = 28  # patch 14 x spatial merge 2
FRAME_FACTOR = 2  # temporal patch
MIN_PIXELS = 56 * 56
MAX_ASPECT_RATIO = 200
MAX_DECODED_FRAMES = 8192


class VideoError(ValueError):
    """The video could not be used; the message says why, for the person who sent it."""


class PathNotAllowed(VideoError):
    pass


def normalize_nframes(requested: int, available: int) -> int:
    """How many frames to send: even, >= 2; never more than available except to reach even (padding)."""
    if available < 1:
        raise VideoError("the video has no frames")
    wanted = max(FRAME_FACTOR, requested + requested % FRAME_FACTOR)
    if wanted <= available:
        return wanted
    return available + available % FRAME_FACTOR


def sample_indices(available: int, requested: int) -> list[int]:
    """Frame indices spread evenly over the episode, first and last included; short videos
    are padded by repeating their last frame (success shows at the end)."""
    count = normalize_nframes(requested, available)
    if count > available:
        return list(range(available)) + [available - 1] * (count - available)
    if count == available:
        return list(range(available))
    return [round(i * (available - 1) / (count - 1)) for i in range(count)]


def smart_size(height: int, width: int, max_pixels: int, min_pixels: int = MIN_PIXELS) -> tuple[int, int]:
    """(h, w) rounded to multiples of 28 with h*w within [min_pixels, max_pixels], aspect kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise VideoError(f"frame aspect ratio {width}x{height} is more extreme than {MAX_ASPECT_RATIO}:1")
    min_pixels = min(min_pixels, max_pixels)
    f = PIXEL_FACTOR
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


def _resizer():
    """Bicubic resize of one frame to (h, w): OpenCV when installed (4x faster), else Pillow."""
    try:
        import cv2

        return lambda frame, h, w: cv2.resize(frame, (w, h), interpolation=cv2.INTER_CUBIC)
    except ImportError:
        from PIL import Image

        return lambda frame, h, w: np.asarray(Image.fromarray(frame).resize((w, h), Image.Resampling.BICUBIC))


_resize = None


def resize_frames(frames: np.ndarray, max_pixels: int) -> np.ndarray:
    """Resize [T, H, W, 3] frames to the model grid; frames already on it are returned as they are."""
    global _resize
    _, height, width, _ = frames.shape
    h, w = smart_size(height, width, max_pixels)
    if (h, w) == (height, width):
        return frames
    if _resize is None:
        _resize = _resizer()
    out = np.empty((frames.shape[0], h, w, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        out[i] = _resize(np.ascontiguousarray(frame), h, w)
    return out


def prepare_frames(frames: np.ndarray | Sequence[np.ndarray], nframes: int, max_pixels: int) -> np.ndarray:
    """Pick nframes (normalized) spread over the episode and fit them to the model grid."""
    total = len(frames)
    picked = np.stack([np.asarray(frames[i]) for i in sample_indices(total, nframes)])
    return resize_frames(picked, max_pixels)


def resolve_video_path(path: str, roots: Sequence[str | os.PathLike]) -> Path:
    """The real path of a requested video, if it lies under one of the allowed roots.

    Symlinks and '..' are resolved before the check, so neither can lead outside a root.
    The error names only what the client sent, never the server's roots or real paths.
    """
    if not roots:
        raise PathNotAllowed("this server does not read video_path; send the video inline (video_b64 or frames)")
    real = Path(os.path.realpath(path))
    for root in roots:
        real_root = Path(os.path.realpath(root))
        if real == real_root or real_root in real.parents:
            if not real.is_file():
                raise VideoError(f"video_path {path!r} does not exist or is not a file")
            return real
    raise PathNotAllowed(f"video_path {path!r} is outside the directories this server may read")


def decode_video(source: str | os.PathLike | bytes) -> list[np.ndarray]:
    """All frames of an encoded video (path or bytes) as RGB uint8 arrays."""
    import av

    handle = io.BytesIO(source) if isinstance(source, bytes | bytearray) else str(source)
    frames: list[np.ndarray] = []
    try:
        with av.open(handle, mode="r") as container:
            if not container.streams.video:
                raise VideoError("the file holds no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            try:
                for frame in container.decode(stream):
                    frames.append(frame.to_ndarray(format="rgb24"))
                    if len(frames) > MAX_DECODED_FRAMES:
                        raise VideoError(f"the video has more than {MAX_DECODED_FRAMES} frames")
            except av.error.FFmpegError:
                # A truncated file still yields the frames before the damage; none is an error below.
                if not frames:
                    raise
    except VideoError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise VideoError(f"the file is not a readable video ({type(exc).__name__})") from None
    if not frames:
        raise VideoError("the video has no frames")
    return frames


def frames_from_inline(frames: InlineFrames) -> np.ndarray:
    try:
        raw = frames.decode()
    except ValueError as exc:
        raise VideoError(str(exc)) from None
    return np.frombuffer(raw, dtype=np.uint8).reshape(frames.shape)


def decode_b64_video(data_b64: str) -> list[np.ndarray]:
    try:
        raw = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise VideoError("video_b64 is not valid base64") from None
    if not raw:
        raise VideoError("video_b64 is empty")
    return decode_video(raw)
