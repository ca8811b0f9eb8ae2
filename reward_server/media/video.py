"""Episode video in, model-ready frames out, within a budget, never following a file elsewhere.

Media files are hostile input. The rules, each closing a class of problems:
- **Paths** are parsed, resolved and opened by paths.py, for every route: under an allowed
  root only, without blocking, regular files only, the opened descriptor checked again.
- **Containers** are chosen by the server from their first bytes, from an allow-list (MP4/MOV,
  Matroska/WebM, AVI); the demuxer gets an open file, never a name, and MOV data references are
  off. Playlists (HLS, DASH), concat lists, image sequences and reference movies never reach a
  demuxer that would open another file.
- **Cost** is bounded before decoding: the frame count comes from a demux pass (no decoding)
  and frame sizes from the stream, each against a limit; then only the frames that will be
  used are converted. Time and memory are bounded by the worker process that runs this
  (decode_pool.py).
"""

from __future__ import annotations

import contextlib
import errno
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from reward_protocol.frames import QWEN2_5_VL, FrameError, FrameSpec
from reward_server.request_errors import FieldError


class VideoError(FieldError, ValueError):
    """The video could not be used; the message says why, for the person who sent it (`param`: the
    chat request's field it came from)."""


class VideoTooLarge(VideoError):
    """The video exceeds a decode budget (frames, pixels, time or memory)."""


@dataclass(frozen=True)
class DecodeLimits:
    max_frames: int = 20_000  # frames in the stream (a 512-step episode at 30 fps is far below)
    max_frame_pixels: int = 1920 * 1088  # per frame: 1080p
    max_file_bytes: int = 1 << 30


# first bytes -> the demuxer allowed to read them
def _sniff(head: bytes) -> str | None:
    if len(head) >= 12 and head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"):
        return "mov,mp4,m4a,3gp,3g2,mj2"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska,webm"
    if head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        return "avi"
    return None


ALLOWED_CONTAINERS = "MP4/MOV, Matroska/WebM, AVI"
_NO_MEMORY = "decoding this video needs more memory than the decode budget allows (--decode-memory-mb)"
# mov: never follow data references to other files (off by default in FFmpeg; stated here)
_DEMUXER_OPTIONS = {"enable_drefs": "0", "use_absolute_path": "0"}


@dataclass(frozen=True)
class Probe:
    """What a video will decode to, known without decoding: its frame count and frame size."""

    frames: int
    height: int
    width: int


def _handle(source: BinaryIO | bytes) -> tuple[BinaryIO, str]:
    handle = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    head = handle.read(16)
    handle.seek(0)
    demuxer = _sniff(head)
    if demuxer is None:
        raise VideoError(f"not a video container this server reads ({ALLOWED_CONTAINERS})")
    return handle, demuxer


def probe_video(source: BinaryIO | bytes, limits: DecodeLimits = DecodeLimits()) -> Probe:
    """Frame count (a demux pass) and frame size (the stream's header) of an encoded video, each
    within its limit: what decoding it will cost, before anything is decoded."""
    import av

    handle, demuxer = _handle(source)
    with _decode_errors(av):
        return _count_frames(av, handle, demuxer, limits)


def decode_frames(
    source: BinaryIO | bytes,
    nframes: int,
    spec: FrameSpec = QWEN2_5_VL,
    limits: DecodeLimits = DecodeLimits(),
    probe: Probe | None = None,
) -> np.ndarray:
    """The `nframes` (normalized by `spec`) frames of an encoded video that the model will see,
    picked exactly as `spec.pick_steps` picks them, as RGB uint8 [T, H, W, 3]. With `probe`
    (probe_video's answer for this file), the count pass is skipped and a stream of another
    size is refused: memory was admitted for that size."""
    import av

    handle, demuxer = _handle(source)
    with _decode_errors(av):
        if probe is None:
            probe = _count_frames(av, handle, demuxer, limits)
            handle.seek(0)
        wanted = spec.pick_steps(probe.frames, nframes)
        return _decode_picked(av, handle, demuxer, wanted, limits, (probe.height, probe.width))


@contextlib.contextmanager
def _decode_errors(av):
    """FFmpeg's and the allocator's failures as the errors a client is shown."""
    try:
        yield
    except (VideoError, FrameError):
        raise
    except MemoryError:
        raise VideoTooLarge(_NO_MEMORY) from None
    except (av.error.FFmpegError, OSError, ValueError, IndexError) as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOMEM, errno.EAGAIN):
            raise VideoTooLarge(_NO_MEMORY) from None  # FFmpeg's allocations or threads refused
        raise VideoError(f"the file is not a readable video ({type(exc).__name__})") from None


def _open(av, handle, demuxer: str):
    options = _DEMUXER_OPTIONS if demuxer.startswith("mov") else {}
    return av.open(handle, mode="r", format=demuxer.split(",")[0], options=dict(options))


def _video_stream(container, limits: DecodeLimits):
    if not container.streams.video:
        raise VideoError("the file holds no video stream")
    stream = container.streams.video[0]
    w, h = stream.codec_context.width, stream.codec_context.height
    if w * h > limits.max_frame_pixels:
        raise VideoTooLarge(f"frames of {w}x{h} exceed the limit of {limits.max_frame_pixels} pixels per frame")
    return stream


def _count_frames(av, handle, demuxer: str, limits: DecodeLimits) -> Probe:
    """Frames in the first video stream, counted from its packets (nothing is decoded), and
    the stream's frame size."""
    with _open(av, handle, demuxer) as container:
        stream = _video_stream(container, limits)
        height, width = stream.codec_context.height, stream.codec_context.width
        count = 0
        for packet in container.demux(stream):
            if packet.size:
                count += 1
                if count > limits.max_frames:
                    raise VideoTooLarge(f"the video has more than {limits.max_frames} frames")
    if count == 0:
        raise VideoError("the video has no frames")
    return Probe(count, height, width)


def _decode_picked(
    av, handle, demuxer: str, wanted: list[int], limits: DecodeLimits, size: tuple[int, int]
) -> np.ndarray:
    """Decode up to the last wanted frame, converting only the wanted ones, each at `size`."""
    last = wanted[-1]
    needed = set(wanted)
    picked: dict[int, np.ndarray] = {}
    with _open(av, handle, demuxer) as container:
        stream = _video_stream(container, limits)
        stream.thread_type = "AUTO"
        stream.codec_context.thread_count = 2  # workers decode in parallel; each needs few threads
        index = -1
        frame = None
        try:
            for frame in container.decode(stream):
                index += 1
                if frame.width * frame.height > limits.max_frame_pixels:
                    raise VideoTooLarge(
                        f"a frame of {frame.width}x{frame.height} exceeds the limit of "
                        f"{limits.max_frame_pixels} pixels per frame"
                    )
                if frame.width * frame.height > size[0] * size[1]:
                    raise VideoTooLarge(
                        f"a frame of {frame.width}x{frame.height} is larger than the {size[1]}x{size[0]} "
                        "its stream declares (memory was admitted for that size)"
                    )
                if index in needed:
                    picked[index] = frame.to_ndarray(format="rgb24")
                if index >= last:
                    break
        except av.error.FFmpegError as exc:
            # a damaged tail still yields the frames before it; running out of memory does not
            if not picked or getattr(exc, "errno", None) in (errno.ENOMEM, errno.EAGAIN):
                raise
    if not picked:
        raise VideoError("the video has no decodable frames")
    # fewer decodable frames than packets (a damaged file): repeat the last one decoded
    latest = picked[max(picked)]
    frames = [picked.get(i, latest) for i in wanted]
    shapes = {f.shape for f in frames}
    if len(shapes) != 1:
        raise VideoError(f"the video changes frame size mid-stream ({sorted(shapes)})")
    return np.stack(frames)


def fit_frames(
    frames: np.ndarray, max_pixels: int, spec: FrameSpec = QWEN2_5_VL, steps: Sequence[int] | None = None
) -> np.ndarray:
    """Resize [T, H, W, 3] frames (those at `steps`, all by default) onto the model grid, each
    straight into the answer. Frames already on the grid are returned as they are when every one
    is kept in order (a view: no copy), else as the picked ones."""
    total, height, width, _ = frames.shape
    try:
        h, w = spec.fit_size(height, width, max_pixels)
    except FrameError as exc:
        raise VideoError(str(exc)) from None
    picked = list(range(total)) if steps is None else list(steps)
    if (h, w) == (height, width):
        return frames if picked == list(range(total)) else frames[picked]
    import cv2

    out = np.empty((len(picked), h, w, 3), dtype=np.uint8)
    for i, step in enumerate(picked):
        out[i] = cv2.resize(np.ascontiguousarray(frames[step]), (w, h), interpolation=cv2.INTER_CUBIC)
    return out


def pick_frames(frames: np.ndarray, nframes: int, spec: FrameSpec = QWEN2_5_VL) -> np.ndarray:
    """The frames of an already-decoded episode that the model will see (spec.pick_steps)."""
    try:
        steps = spec.pick_steps(len(frames), nframes)
    except FrameError as exc:
        raise VideoError(str(exc)) from None
    return frames[steps]
