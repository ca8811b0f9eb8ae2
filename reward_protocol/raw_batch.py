"""The raw batch body: many episodes' frames as bytes, with no JSON or base64 around pixels.

    b"RWB1" | header length (uint32, little-endian) | header (JSON, RawBatchHeader) | payload

Each episode sent as frames names its region of the payload (`frames.offset`, `frames.shape`:
[T, H, W, 3] uint8, C-order; float frames in [0, 1] are converted by reward_protocol.frames.as_uint8
before they are written, anything else is refused); an episode of several camera views names one
region per view (`views`: name and frames each). The sender writes frames straight from its
arrays, and the server uses them in place (numpy views of the body it received): nothing is encoded or copied on the
way, which base64 in JSON costs twice (4/3 the bytes, an encode and a decode per frame).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from reward_protocol.bounded_json import InvalidJSON, loads_bounded
from reward_protocol.frames import FrameError, as_uint8
from reward_protocol.score import FramesRef, RawBatchHeader, RawScoreItem, ScoreOptions, wide_pixels_hint

CONTENT_TYPE = "application/x-reward-batch"
MAGIC = b"RWB1"
_PREFIX = struct.Struct("<4sI")
MAX_HEADER_BYTES = 4 * 1024 * 1024


class RawBatchError(ValueError):
    """The body is not a valid raw batch; the message says what is wrong."""

    def __init__(self, message: str, errors: list | None = None):
        super().__init__(message)
        self.errors = errors  # pydantic's error list when the header failed validation


@dataclass
class RawBatchBody:
    """An encoded body as a list of buffers (frames are not copied into one bytes object)."""

    parts: list[bytes | memoryview]

    @property
    def nbytes(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in self.parts)

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


def _fields(options: ScoreOptions) -> dict:
    fields = options.model_dump(
        include=set(ScoreOptions.model_fields), exclude_none=True, exclude_defaults=True, mode="json"
    )
    fields["task_text"] = options.task_text
    return fields


# One episode's video: frames [T, H, W, 3] uint8, several named camera views of it ({name: frames},
# in the order the model sees them), or a server-side video path.
Video = np.ndarray | Mapping[str, np.ndarray] | str


def checked_video(video: Video) -> np.ndarray | dict[str, np.ndarray] | str:
    """A server-side path as it is, or frames (each view's) as C-order uint8 [T, H, W, 3] by the
    one pixel rule (reward_protocol.frames.as_uint8: float in [0, 1] becomes round(x * 255); other
    dtypes are refused)."""
    if isinstance(video, str):
        return video
    if isinstance(video, Mapping):
        return {name: checked_video(frames) for name, frames in video.items()}
    arr = np.ascontiguousarray(as_uint8(video))
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise FrameError(f"frames must be [T, H, W, 3] uint8, got shape {list(arr.shape)}")
    return arr


_OFFSET_DIGITS = 20  # room for any offset's digits in an item's size estimate


def item_nbytes(options: ScoreOptions, video: Video) -> int:
    """An upper bound of what one item adds to a raw batch body: its header entry and its frames."""
    if isinstance(video, str):
        return len(json.dumps({**_fields(options), "video_path": video}, separators=(",", ":"))) + 1
    if isinstance(video, Mapping):
        views = [{"name": name, "frames": {"shape": list(np.shape(v)), "offset": 0}} for name, v in video.items()]
        entry = {**_fields(options), "views": views}
        pixels = sum(int(np.prod(np.shape(v))) for v in video.values())
        return len(json.dumps(entry, separators=(",", ":"))) + 1 + _OFFSET_DIGITS * len(views) + pixels
    shape = list(np.shape(video))
    entry = {**_fields(options), "frames": {"shape": shape, "offset": 0}}
    return len(json.dumps(entry, separators=(",", ":"))) + 1 + _OFFSET_DIGITS + int(np.prod(shape))


def encode(items: Sequence[tuple[ScoreOptions, Video]]) -> RawBatchBody:
    """A raw batch of (options, video) pairs (`Video`: frames, named views, or a server-side path)."""
    entries, frames, offset = [], [], 0

    def region(arr: np.ndarray) -> dict:
        nonlocal offset
        frames.append(memoryview(arr).cast("B"))
        offset += arr.nbytes
        return {"shape": list(arr.shape), "offset": offset - arr.nbytes}

    for options, video in items:
        fields = _fields(options)
        video = checked_video(video)
        if isinstance(video, str):
            entries.append({**fields, "video_path": video})
        elif isinstance(video, dict):
            entries.append({**fields, "views": [{"name": name, "frames": region(v)} for name, v in video.items()]})
        else:
            entries.append({**fields, "frames": region(video)})
    header = json.dumps({"requests": entries}, separators=(",", ":")).encode()
    return RawBatchBody([_PREFIX.pack(MAGIC, len(header)), header, *frames])


PREFIX_BYTES = _PREFIX.size


def header_end(prefix: bytes | memoryview) -> int:
    """Where the header ends (= the payload starts), read from the body's first PREFIX_BYTES."""
    if len(prefix) < _PREFIX.size:
        raise RawBatchError(f"body of {len(prefix)} bytes is shorter than the raw batch prefix")
    magic, header_len = _PREFIX.unpack_from(prefix)
    if magic != MAGIC:
        raise RawBatchError(f"body does not start with {MAGIC!r}: not a raw batch (content-type {CONTENT_TYPE})")
    if header_len > MAX_HEADER_BYTES:
        raise RawBatchError(f"header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    return _PREFIX.size + header_len


def decode_header(head: bytes | memoryview, body_length: int) -> RawBatchHeader:
    """The validated header of a body of body_length bytes whose first bytes are `head`
    (at least up to the header's end); every frames region must lie inside the payload."""
    end = header_end(head)
    if end > body_length or len(head) < end:
        raise RawBatchError(f"header length {end - _PREFIX.size} is larger than the body")
    try:  # the server's one bounded decoder: the same limits and errors as its JSON bodies
        data = loads_bounded(head[_PREFIX.size : end], what="raw batch header", max_bytes=MAX_HEADER_BYTES)
    except InvalidJSON as exc:
        raise RawBatchError(str(exc)) from None
    try:
        header = RawBatchHeader.model_validate(data)
    except ValidationError as exc:
        raise RawBatchError("header failed validation", exc.errors()) from None
    payload = body_length - end
    for index, item in enumerate(header.requests):
        for ref in item.frame_refs():
            if ref.offset + ref.nbytes > payload:
                raise RawBatchError(
                    f"requests.{index}.frames: {list(ref.shape)} at offset {ref.offset} needs "
                    f"{ref.offset + ref.nbytes} payload bytes, the body has {payload}"
                )
    # one rule for every length: the payload ends where its last frames region ends. Bytes no
    # region names are refused however many (frames written as float32 with uint8 shapes are 4x:
    # the hint says so), never ignored.
    end = max((ref.offset + ref.nbytes for item in header.requests for ref in item.frame_refs()), default=0)
    if payload != end:
        named = sum(ref.nbytes for item in header.requests for ref in item.frame_refs())
        raise RawBatchError(
            f"the payload holds {payload} bytes but its header's frames end at byte {end} ({named} bytes of "
            f"frames named): {payload - end} bytes no frames region names; the payload must end where the last "
            f"region ends{wide_pixels_hint(payload, named)}"
        )
    return header


def decode(body: bytes | bytearray | memoryview) -> tuple[RawBatchHeader, memoryview]:
    """The header (validated) and the payload of a complete body."""
    view = memoryview(body)
    header = decode_header(view, len(view))
    return header, view[header_end(view) :]


def frames_view(ref: FramesRef, payload: memoryview) -> np.ndarray:
    """The frames of one item as a read-only array over the payload (no copy)."""
    return np.frombuffer(payload, dtype=np.uint8, count=ref.nbytes, offset=ref.offset).reshape(ref.shape)


__all__ = [
    "CONTENT_TYPE",
    "PREFIX_BYTES",
    "RawBatchBody",
    "RawBatchError",
    "RawBatchHeader",
    "RawScoreItem",
    "Video",
    "checked_video",
    "decode",
    "decode_header",
    "encode",
    "frames_view",
    "header_end",
    "item_nbytes",
]
