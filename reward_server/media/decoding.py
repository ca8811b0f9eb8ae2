"""Request bodies -> episodes with model-ready frames, never on the event loop, never serially.

Three ways frames arrive, each prepared where it is cheapest and safe:
- raw batch bodies (reward_protocol.raw_batch): the header is parsed in a thread; each episode's
  frames are used in place (a view of the body) and picked and resized in a thread as soon as
  its bytes have arrived (OpenCV releases the GIL). No process hop, no copy of the body.
- JSON bodies: parsed and validated in a decode worker process (a 256 MB JSON document would
  hold the GIL for a second); inline frames come back decoded, and each episode is then
  prepared on its own.
- encoded videos (video_path, video_b64): decoded in a worker process, each on its own, within
  the pool's time and memory budget (decode_pool.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from reward_protocol.bounded_json import InvalidJSON, loads_bounded
from reward_protocol.chat import ChatCompletionRequest
from reward_protocol.frames import FrameError, FrameSpec
from reward_protocol.score import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_NFRAMES,
    BatchScoreRequest,
    InlineFrames,
    ScoreOptions,
    ScoreRequest,
)
from reward_server.media.decode_pool import DecodePool
from reward_server.media.decoded_budget import DecodedBudget, Lease, decoded_bytes
from reward_server.media.images import MediaRef, decode_chat_media, media_bytes, probe_chat_media
from reward_server.media.paths import open_confined
from reward_server.media.video import DecodeLimits, Probe, VideoError, decode_frames, fit_frames, probe_video
from reward_server.request_errors import FieldError

SMALL_BODY_BYTES = 1 << 20  # a JSON body parsed in a thread; larger ones in a decode worker
T = TypeVar("T")


class InvalidBody(FieldError, ValueError):
    """The body is not valid for this route, or fails validation; the message names the field
    (and `param`, where one field is at fault, OpenAI-style: `messages[0].content`)."""


_TYPE_SEGMENTS = {"str", "int", "float", "bool", "list", "dict", "none"}


def error_param(errors: list) -> str | None:
    """The first failing field's path (`messages[0].content`), without pydantic's union branch names."""
    if not errors:
        return None
    out = ""
    for part in errors[0].get("loc", ()):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "body":
            continue
        elif not str(part).isidentifier() or str(part) in _TYPE_SEGMENTS:
            break
        else:
            out += f".{part}" if out else str(part)
    return out or None


SourceKind = Literal["path", "encoded", "frames", "views"]
View = tuple[str, np.ndarray]  # one named camera view of an episode: (name, frames [T, H, W, 3])


@dataclass
class Source:
    """One episode as parsed: its options, and where its video is (not yet model-ready)."""

    options: ScoreOptions
    kind: SourceKind
    payload: str | bytes | np.ndarray | list[View]


def validation_message(errors: list) -> str:
    """One line naming each failing field and what is wrong with it (pydantic's error list)."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = "unknown field (not part of the API)" if err.get("type") == "extra_forbidden" else err.get("msg", "")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts) or "invalid request body"


def _validate(model: type[BaseModel], body: bytes) -> BaseModel:
    try:  # one bounded decoder for every body and the raw batch header (same input, same 422)
        data = loads_bounded(body, what="body")
    except InvalidJSON as exc:
        raise InvalidBody(str(exc)) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        raise InvalidBody(validation_message(errors), error_param(errors)) from None


def _source(req: ScoreRequest) -> Source | VideoError:
    options = ScoreOptions.model_construct(**{name: getattr(req, name) for name in ScoreOptions.model_fields})
    if req.video_path is not None:
        return Source(options, "path", req.video_path)
    if req.video_b64 is not None:
        import pybase64

        try:
            raw = pybase64.b64decode(req.video_b64, validate=True)
        except ValueError:
            return VideoError("video_b64 is not valid base64")
        return Source(options, "encoded", raw) if raw else VideoError("video_b64 is empty")
    try:
        if req.views is not None:
            return Source(options, "views", [(view.name, _inline(view.frames)) for view in req.views])
        assert req.frames is not None
        return Source(options, "frames", _inline(req.frames))
    except ValueError as exc:
        return VideoError(str(exc))


def _inline(frames: InlineFrames) -> np.ndarray:
    return np.frombuffer(frames.decode(), dtype=np.uint8).reshape(frames.shape)


# --- run in decode workers ----------------------------------------------------------------------


def parse_score_json(body: bytes) -> Source | VideoError:
    return _source(_validate(ScoreRequest, body))


class _BatchEnvelope(BaseModel):
    """A JSON batch's outside (BatchScoreRequest's bounds), its items validated one by one."""

    model_config = ConfigDict(extra="forbid")

    requests: list[Any] = BatchScoreRequest.model_fields["requests"]


def parse_batch_json(body: bytes) -> list[Source | VideoError | InvalidBody]:
    """Each item of a JSON batch on its own: one that fails validation is that item's 422 error
    (`requests.<i>.<field>: ...`), the others are scored (as a raw batch's frames errors are). A
    body that is not a batch (not JSON, no `requests` list, too many items) fails as a whole."""
    envelope = _validate(_BatchEnvelope, body)
    out: list[Source | VideoError | InvalidBody] = []
    for index, item in enumerate(envelope.requests):  # type: ignore[attr-defined]
        try:
            req = ScoreRequest.model_validate(item)
        except ValidationError as exc:
            errors = [{**e, "loc": ("requests", index, *e.get("loc", ()))} for e in exc.errors()]
            out.append(InvalidBody(validation_message(errors), error_param(errors)))
            continue
        out.append(_source(req))
    return out


def parse_chat_json(body: bytes) -> ChatCompletionRequest:
    return _validate(ChatCompletionRequest, body)  # type: ignore[return-value]


def probe_media(kind: SourceKind, payload: str | bytes, roots: Sequence[str], limits: DecodeLimits) -> Probe:
    """Frame count and size of an encoded video (a confined path, or the file's bytes), undecoded."""
    if kind == "path":
        assert isinstance(payload, str)
        with open_confined(payload, roots, limits.max_file_bytes) as fh:
            return probe_video(fh, limits)
    assert isinstance(payload, bytes)
    return probe_video(payload, limits)


def decode_media(
    kind: SourceKind,
    payload: str | bytes,
    nframes: int,
    max_pixels: int,
    spec: FrameSpec,
    roots: Sequence[str],
    limits: DecodeLimits,
    probe: Probe | None = None,
) -> np.ndarray:
    """Model-ready frames of an encoded video (a confined path, or the file's bytes)."""
    if kind == "path":
        assert isinstance(payload, str)
        with open_confined(payload, roots, limits.max_file_bytes) as fh:
            frames = decode_frames(fh, nframes, spec, limits, probe)
    else:
        assert isinstance(payload, bytes)
        frames = decode_frames(payload, nframes, spec, limits, probe)
    return fit_frames(frames, max_pixels, spec)


# --- in the server process ----------------------------------------------------------------------


def prepare_raw(frames: np.ndarray, nframes: int, max_pixels: int, spec: FrameSpec) -> np.ndarray:
    """Model-ready frames from raw frames (in a thread: resizing releases the GIL). Frames that
    are already model-ready (every frame picked, on the grid) stay what they are, a view of the
    body; otherwise the picked frames are resized straight into the answer, with no picked copy
    in between."""
    try:
        steps = spec.pick_steps(len(frames), nframes)
    except FrameError as exc:
        raise VideoError(str(exc)) from None
    return np.ascontiguousarray(fit_frames(frames, max_pixels, spec, steps))


CHAT_ADVICE = "send fewer images or smaller ones, or start the server with a larger --max-decoded-mb"


@dataclass
class ChatMedia:
    """A chat request's model-ready images and videos, and their share of the decoded-memory
    budget (None without a budget), held until release(): once the request's answer is done."""

    arrays: list[np.ndarray]
    lease: Lease | None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


class Preparer:
    """Turns parsed sources into model-ready frames, in the right place for each kind."""

    def __init__(
        self,
        pool: DecodePool,
        spec: FrameSpec,
        roots: Sequence[str],
        limits: DecodeLimits,
        budget: DecodedBudget | None = None,
    ):
        self.pool = pool
        self.budget = budget
        self.spec = spec
        self.roots = list(roots)
        self.limits = limits

    async def parse(self, fn: Callable[[bytes], T], body: memoryview) -> T:
        """A JSON document is parsed in one piece: small ones in a thread (microseconds of GIL),
        large ones in a decode worker, where seconds of parsing cannot stall the engine."""
        if len(body) <= SMALL_BODY_BYTES:
            return await asyncio.to_thread(fn, bytes(body))
        return await self.pool.run(fn, bytes(body), task="body")

    async def frames(self, source: Source) -> np.ndarray | list[View]:
        """Model-ready frames (several views: each view's, named, in order)."""
        o = source.options
        if source.kind == "frames":
            assert isinstance(source.payload, np.ndarray)
            return await self.raw(source.payload, o.nframes, o.max_pixels)
        if source.kind == "views":
            assert isinstance(source.payload, list)
            return await self.views(source.payload, o.nframes, o.max_pixels)
        probe = None
        if self.budget is not None:  # what decoding will make, known before decoding
            probe = await self.pool.run(probe_media, source.kind, source.payload, self.roots, self.limits)
            await self._admit([(probe.frames, probe.height, probe.width)], o.nframes, o.max_pixels)
        return await self.pool.run(
            decode_media,
            source.kind,
            source.payload,
            o.nframes,
            o.max_pixels,
            self.spec,
            self.roots,
            self.limits,
            probe,
        )

    async def media(self, refs: Sequence[MediaRef]) -> ChatMedia:
        """A chat request's images and videos, model-ready, in order (videos sampled as /score's
        defaults), within the decoded-memory budget: probed (headers and a demux pass, nothing
        decoded), their decoded size taken from the budget, then decoded, each step one
        decode-worker task within the pool's time and memory budget. The exact size, not an upper
        bound (images x --max-frame-pixels): a chat image is mostly far smaller than the cap (a
        256x256 camera frame is 3% of it), so a bound would count such a request 33 times over
        and hold 33x fewer of them at once; the probe costs one more decode-worker round trip.
        The caller gives the share back once the request's answer is done (ChatMedia.release)."""
        if not refs:
            return ChatMedia([], None)
        task = "media" if any(ref.kind == "video" for ref in refs) else "image"
        refs = list(refs)
        lease, probes = None, None
        if self.budget is not None:
            probes = await self.pool.run(probe_chat_media, refs, self.roots, self.limits, task=task)
            nbytes = media_bytes(refs, probes, self.limits, self.spec, DEFAULT_NFRAMES, DEFAULT_MAX_PIXELS)
            images = sum(ref.kind == "image" for ref in refs)
            what = f"this request's {images} image(s)" + (" and video" if len(refs) > images else "")
            lease = await self.budget.take(nbytes, what, CHAT_ADVICE)
        try:
            arrays = await self.pool.run(
                decode_chat_media,
                refs,
                self.roots,
                self.limits,
                self.spec,
                DEFAULT_NFRAMES,
                DEFAULT_MAX_PIXELS,
                probes,
                task=task,
            )
        except BaseException:  # failed or cancelled: nothing is held
            if lease is not None:
                lease.release()
            raise
        return ChatMedia(arrays, lease)

    async def raw(self, frames: np.ndarray, nframes: int, max_pixels: int) -> np.ndarray:
        """Model-ready frames from decoded ones (a raw batch item's view of the body, or inline
        frames), within the decoded-memory budget."""
        await self._admit([frames.shape[:3]], nframes, max_pixels)
        return await asyncio.to_thread(prepare_raw, frames, nframes, max_pixels, self.spec)

    async def views(self, views: Sequence[View], nframes: int, max_pixels: int) -> list[View]:
        """Each camera view model-ready, as `raw` makes one (the same steps picked from each), under
        one budget lease for the whole episode, taken before any view is prepared: a lease per view,
        each held until the answer, let episodes hold some views while waiting for the rest, and
        deadlock each other (issue 58)."""
        await self._admit([frames.shape[:3] for _, frames in views], nframes, max_pixels)
        return [
            (name, await asyncio.to_thread(prepare_raw, frames, nframes, max_pixels, self.spec))
            for name, frames in views
        ]

    async def _admit(self, shapes: Sequence[tuple[int, ...]], nframes: int, max_pixels: int) -> None:
        """Take the episode's decoded size (every view's frames [T, H, W]) from the budget, at
        once, until its task (its answer) ends."""
        if self.budget is None:
            return
        nbytes = sum(decoded_bytes(t, h, w, nframes, max_pixels, self.spec) for t, h, w in shapes)
        sizes = ", ".join(f"{t} frames of {w}x{h}" for t, h, w in shapes)
        views = f"{len(shapes)} views: " if len(shapes) > 1 else ""
        lease = await self.budget.take(nbytes, f"this episode ({views}{sizes}, nframes {nframes})")
        lease.hold_until_task_ends()
