"""Images and videos of chat requests (`image_url`, `video_url`), in a decode worker, within budgets.

A chat request names its media by URL. What is read, and how:
- `data:` URLs, base64 only: images in JPEG, PNG or WebP (the format is taken from the bytes,
  never from the declared MIME type), videos in the containers video.py reads (MP4 first).
- `file://` URLs: parsed, resolved and opened by paths.py as every `video_path` is (under
  `--video-root` only, symlinks resolved, regular files only, the descriptor checked again).
- http(s) and every other scheme are refused (`invalid_url`): the server fetches nothing.
Errors are named for what failed: the URL or path (paths.py), the image (`invalid_image`,
`image_too_large`) or the video (`invalid_video`, `video_too_large`).

An image's size is read from its header and checked against `--max-frame-pixels` before any
pixel is decoded (a 60000 x 60000 PNG of a few kilobytes is refused at once); the worker's
memory budget stands behind that. Decoded images are resized onto the model's pixel
grid here (the multiple-of-28 sizes Qwen2.5-VL's processor would pick), so the engine gets
arrays it can use as they are and no processor error can come from an odd size.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

import numpy as np

from reward_protocol.frames import FrameError, FrameSpec
from reward_server.media.decoded_budget import decoded_bytes
from reward_server.media.paths import file_url_path, open_confined, refuse_url, url_scheme
from reward_server.media.video import (
    DecodeLimits,
    Probe,
    VideoError,
    VideoTooLarge,
    decode_frames,
    fit_frames,
    probe_video,
)

IMAGE_FORMATS = "JPEG, PNG, WebP"


class ImageError(VideoError):
    """An image that cannot be used; `param` names the request field."""


class ImageTooLarge(ImageError, VideoTooLarge):
    """An image beyond the pixel budget, or one whose decoding ran out of the worker's budget."""


MediaKind = Literal["image", "video"]


@dataclass(frozen=True)
class MediaRef:
    """One image_url / video_url of a chat request, and where it sits in the request (for errors)."""

    kind: MediaKind
    url: str
    param: str


def _sniff_image(head: bytes) -> str | None:
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


def _media_error(ref: MediaRef, message: str) -> VideoError:
    """An error about the media itself, named for its kind (invalid_image / invalid_video)."""
    if ref.kind == "image":
        return ImageError(message, ref.param)
    return VideoError(message, ref.param)


def _from_data_url(ref: MediaRef) -> bytes:
    head, sep, data = ref.url[5:].partition(",")
    example = "data:image/jpeg;base64,..." if ref.kind == "image" else "data:video/mp4;base64,..."
    if not sep:
        raise _media_error(ref, f"malformed data URL: no ',' between its header and its data ({example})")
    params = [p.strip().lower() for p in head.split(";")]
    if "base64" not in params[1:]:
        raise _media_error(ref, f"data URLs must be base64-encoded ({example})")
    mime = params[0]
    if ref.kind == "image" and mime and not mime.startswith("image/"):
        raise _media_error(ref, f"an image_url data URL must hold an image, not {mime!r}")
    if ref.kind == "video" and mime and not mime.startswith("video/"):
        raise _media_error(ref, f"a video_url data URL must hold a video, not {mime!r}")
    import pybase64

    try:
        raw = pybase64.b64decode(data, validate=True)
    except ValueError:
        raise _media_error(ref, "the data URL's data is not valid base64") from None
    if not raw:
        raise _media_error(ref, "the data URL holds no data")
    return raw


def _read(ref: MediaRef, roots: Sequence[str], limits: DecodeLimits) -> bytes | BinaryIO:
    """The bytes behind a URL (data:), or an open confined file (file://); paths.py parses,
    resolves and opens file URLs as it does every path a request names."""
    scheme = url_scheme(ref.url)
    if scheme == "data":
        return _from_data_url(ref)
    if scheme == "file":
        path = file_url_path(ref.url, ref.param)
        return open_confined(path, roots, limits.max_file_bytes, "file", ref.param)
    raise refuse_url(ref.url, ref.kind, ref.param)


@contextlib.contextmanager
def _source(ref: MediaRef, roots: Sequence[str], limits: DecodeLimits) -> Iterator[bytes | BinaryIO]:
    """`_read`'s source, closed afterwards; a video's errors name the request field it came from
    (an image's errors already do)."""
    source = _read(ref, roots, limits)
    try:
        yield source
    except ImageError:
        raise
    except VideoError as exc:
        if ref.kind == "image":
            raise
        raise exc.at(ref.param) from None
    finally:
        if not isinstance(source, bytes):
            source.close()


@contextlib.contextmanager
def _open_image(data: bytes | BinaryIO, limits: DecodeLimits, param: str) -> Iterator[Any]:
    """The image opened from its header (nothing decoded yet), its declared size checked against
    --max-frame-pixels; errors while it is open are named for the image."""
    handle = io.BytesIO(data) if isinstance(data, bytes) else data
    fmt = _sniff_image(handle.read(16))
    handle.seek(0)
    if fmt is None:
        raise ImageError(f"not an image format this server reads ({IMAGE_FORMATS})", param)
    from PIL import Image

    max_pixels = limits.max_frame_pixels
    # Our check below reads the same header Pillow's would and refuses at the configured limit,
    # before anything is decoded, with the declared size in the message; Pillow's refusal at
    # open (at twice its own limit) would say less.
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(handle, formats=[fmt]) as im:
                width, height = im.size  # from the header: nothing decoded yet
                if width * height > max_pixels:
                    raise ImageTooLarge(
                        f"the image declares {width}x{height} pixels; the limit is {max_pixels} (--max-frame-pixels)",
                        param,
                    )
                yield im
    except ImageError:
        raise
    except Image.DecompressionBombError:
        raise ImageTooLarge(f"the image has more than {max_pixels} pixels (--max-frame-pixels)", param) from None
    except MemoryError:
        raise ImageTooLarge("decoding this image needs more memory than the decode budget allows", param) from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError) as exc:
        raise ImageError(f"the {fmt} data is not a readable image ({type(exc).__name__})", param) from None


def probe_image(data: bytes | BinaryIO, limits: DecodeLimits, param: str = "") -> Probe:
    """An image's size from its header (one frame), within --max-frame-pixels; nothing decoded."""
    with _open_image(data, limits, param) as im:
        width, height = im.size
    return Probe(frames=1, height=height, width=width)


def decode_image(
    data: bytes | BinaryIO, limits: DecodeLimits, spec: FrameSpec, param: str = "", probe: Probe | None = None
) -> np.ndarray:
    """RGB uint8 [H, W, 3] on the model's pixel grid, from JPEG / PNG / WebP bytes (or an open file).
    With `probe` (probe_image's answer), an image of another size is refused: memory was admitted
    for that size (a file can be replaced between the probe and the decode)."""
    with _open_image(data, limits, param) as im:
        width, height = im.size
        if probe is not None and (height, width) != (probe.height, probe.width):
            raise ImageError(
                f"the image changed while it was read: {width}x{height}, probed as {probe.width}x{probe.height}",
                param,
            )
        im.seek(0)  # an animated WebP / PNG: its first frame
        rgb = np.asarray(im.convert("RGB"))
    try:
        return fit_frames(rgb[None], limits.max_frame_pixels, spec)[0]
    except (VideoError, FrameError) as exc:
        raise ImageError(f"the image cannot be shown to the model: {exc}", param) from None


def media_bytes(
    refs: Sequence[MediaRef],
    probes: Sequence[Probe],
    limits: DecodeLimits,
    spec: FrameSpec,
    nframes: int,
    video_max_pixels: int,
) -> int:
    """Bytes of a chat request's model-ready images and videos (after the resize decoding applies),
    from their probes; an item whose size the spec refuses counts 0 (decoding it raises the error
    the client sees)."""
    total = 0
    for ref, probe in zip(refs, probes, strict=True):
        if ref.kind == "video":
            total += decoded_bytes(probe.frames, probe.height, probe.width, nframes, video_max_pixels, spec)
            continue
        try:  # an image is resized onto the grid within --max-frame-pixels (decode_image)
            height, width = spec.fit_size(probe.height, probe.width, limits.max_frame_pixels)
        except FrameError:
            continue
        total += height * width * 3
    return total


def probe_chat_media(refs: Sequence[MediaRef], roots: Sequence[str], limits: DecodeLimits) -> list[Probe]:
    """The size of every image and video of one chat request, from headers and a demux pass only
    (nothing decoded), so its decoded size is taken from the decoded-memory budget before any
    pixel is made (a decode worker runs this, as it runs the decode)."""
    out = []
    for ref in refs:
        with _source(ref, roots, limits) as source:
            if ref.kind == "image":
                out.append(probe_image(source, limits, ref.param))
            else:
                out.append(probe_video(source, limits))
    return out


def decode_chat_media(
    refs: Sequence[MediaRef],
    roots: Sequence[str],
    limits: DecodeLimits,
    spec: FrameSpec,
    nframes: int,
    video_max_pixels: int,
    probes: Sequence[Probe] | None = None,
) -> list[np.ndarray]:
    """Every image ([H, W, 3]) and video ([T, H, W, 3]) of one chat request, in order (a decode
    worker runs this: one task per request, within the pool's time and memory budget). With
    `probes` (probe_chat_media's answer), media of another size than probed are refused."""
    out = []
    for i, ref in enumerate(refs):
        probe = probes[i] if probes is not None else None
        with _source(ref, roots, limits) as source:
            if ref.kind == "image":
                out.append(decode_image(source, limits, spec, ref.param, probe))
            else:
                frames = decode_frames(source, nframes, spec, limits, probe)
                out.append(fit_frames(frames, video_max_pixels, spec))
    return out
