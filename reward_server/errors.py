"""Error types: one table (ERROR_TYPES) names every `error.type`, its status, the classes that raise
it and when, and the body each is answered with; no internals leaked. The HTTP layer turns them
into responses (http/errors.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from reward_protocol.chat import OpenAIError, OpenAIErrorBody, openai_error_type
from reward_protocol.progress import ProgressPointsError
from reward_protocol.score import RETRYABLE_STATUSES, ErrorBody, ItemError
from reward_server.core.admission import Overloaded, TooMuchForServer
from reward_server.core.service import DeadlineExceeded, NotReady
from reward_server.engines.base import AnswerWordsUnsupported, EngineDead, EngineInputRejected, EngineRequestFailed
from reward_server.media.decode_pool import WorkerDied
from reward_server.media.decoded_budget import DecodedTooLarge
from reward_server.media.decoding import InvalidBody
from reward_server.media.images import ImageError, ImageTooLarge
from reward_server.media.paths import FileNotFound, FileTooLarge, InvalidPath, InvalidURL, PathNotAllowed
from reward_server.media.video import VideoError, VideoTooLarge
from reward_server.profiles import UnknownBackend, UnsupportedOption
from reward_server.request_errors import (
    BadRequest,
    BodyDeadline,
    BodyTimeout,
    BodyTooLarge,
    ClientGone,
    FieldError,
    LengthRequired,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class UnsupportedMediaType(ValueError):
    pass


class Unauthorized(PermissionError):
    pass


class NotFound(FieldError, LookupError):
    """The request names something this server does not have (a model under /v1)."""


class TooManyImages(BadRequest):
    """More images in one chat request than --max-images-per-request."""


@dataclass(frozen=True)
class ErrorType:
    """One `error.type` the server answers with: its status, the exception classes that raise it
    (none: answered by the HTTP layer itself), and when it happens (docs/api.md is made from this)."""

    type: str
    status: int
    when: str
    classes: tuple[type[BaseException], ...] = ()

    @property
    def retryable(self) -> bool:
        """Sending the same request again can succeed (the wire schema's `ItemError.retryable`)."""
        return self.status in RETRYABLE_STATUSES


# Every error type, in one table. Order matters: a class is matched by its first row, so
# subclasses come before their bases (ImageTooLarge before ImageError before VideoError).
ERROR_TYPES: list[ErrorType] = [
    ErrorType(
        "unauthorized",
        401,
        "`--api-key` is set and the `Authorization: Bearer` header is missing or wrong",
        (Unauthorized,),
    ),
    ErrorType(
        "invalid_request",
        422,
        "the body is not valid JSON or not a valid raw batch, or a field fails validation (the message names it)",
        (InvalidBody, ProgressPointsError),
    ),
    ErrorType(
        "body_too_large",
        413,
        "the body is larger than `--max-body-mb`, or a JSON body larger than a decode worker can parse within "
        "`--decode-memory-mb` (about 1/16 of it; send frames as a raw batch), or parsing it ran out of that "
        "memory or of `--decode-timeout-s`",
        (BodyTooLarge,),
    ),
    ErrorType(
        "request_too_large",
        413,
        "one request alone exceeds what the server ever holds: more episodes than `--max-queue`, "
        "or a body larger than `--max-inflight-mb`",
        (TooMuchForServer,),
    ),
    ErrorType("length_required", 411, "a raw batch body without `Content-Length`", (LengthRequired,)),
    ErrorType(
        "body_timeout",
        408,
        "the body stalled for `--body-timeout-s`, arrived slower than `--body-min-rate-kib-s` on average after "
        "that grace, or not within `--request-timeout-s` (a trickle cannot extend it); the connection is closed. "
        "A client deadline (`X-Reward-Deadline-S`) that passes first is a 504 `deadline_exceeded`, not this",
        (BodyTimeout,),
    ),
    ErrorType("header_timeout", 408, "the request head did not arrive within `--header-timeout-s`"),
    ErrorType("request_head_too_large", 431, "the request line and headers exceed `--max-header-kb`"),
    ErrorType(
        "unsupported_media_type",
        415,
        "a content type other than `application/json` (or `application/x-reward-batch` on `/score/batch`)",
        (UnsupportedMediaType,),
    ),
    ErrorType(
        "invalid_url",
        400,
        "a chat `image_url` / `video_url` that is not a `data:` URL or a `file:///absolute/path` "
        "(http(s) is never fetched; no host, query or fragment; percent-encoding must decode to UTF-8)",
        (InvalidURL,),
    ),
    ErrorType(
        "invalid_path",
        400,
        "a `video_path` or file URL path that cannot name a readable file: relative, a NUL, longer than "
        "4096 characters, not a regular file (directory, FIFO, device), or not openable",
        (InvalidPath,),
    ),
    ErrorType("file_not_found", 400, "no file at a `video_path` or file URL under `--video-root`", (FileNotFound,)),
    ErrorType("file_too_large", 413, "the named file is larger than the server reads (1 GiB)", (FileTooLarge,)),
    ErrorType(
        "path_not_allowed",
        403,
        "a `video_path` or file URL outside every `--video-root` (symlinks and `..` are resolved first)",
        (PathNotAllowed,),
    ),
    ErrorType(
        "image_too_large",
        413,
        "an image over `--max-frame-pixels` (read from its header, before decoding), or whose decoding "
        "ran out of `--decode-memory-mb` or `--decode-timeout-s`",
        (ImageTooLarge,),
    ),
    ErrorType(
        "invalid_image",
        400,
        "an image that cannot be used: not JPEG, PNG or WebP, a malformed or non-base64 data URL, undecodable",
        (ImageError,),
    ),
    ErrorType(
        "decoded_too_large",
        413,
        "one episode's decoded frames, or one chat request's images and video (frames x height x width x 3 "
        "after the resize, known before decoding), exceed the whole `--max-decoded-mb` budget (in a batch: "
        "that item's error; in chat: `param` `messages`); one that fits later waits its turn within its deadline",
        (DecodedTooLarge,),
    ),
    ErrorType(
        "video_too_large",
        413,
        "a video over a decode budget: `--max-video-frames`, `--max-frame-pixels` (from the stream header), "
        "`--decode-timeout-s`, `--decode-memory-mb`",
        (VideoTooLarge,),
    ),
    ErrorType(
        "invalid_video",
        400,
        "a video that cannot be used: not MP4/MOV, Matroska/WebM or AVI, undecodable, no frames, "
        "bad base64 or frame data",
        (VideoError,),
    ),
    ErrorType(
        "worker_died",
        400,
        "decoding this input killed a decode worker twice (a crash in a decoder); the input is refused",
        (WorkerDied,),
    ),
    ErrorType("unknown_backend", 400, "`backend` names a profile this server does not run", (UnknownBackend,)),
    ErrorType(
        "unsupported_option",
        400,
        "an option the backend, engine or deployment does not support (e.g. `max_tokens` over `--max-tokens-limit`)",
        (AnswerWordsUnsupported, UnsupportedOption),
    ),
    ErrorType(
        "input_rejected", 400, "the engine refused this input (e.g. the prompt is too long)", (EngineInputRejected,)
    ),
    ErrorType(
        "too_many_images", 400, "more images in one chat request than `--max-images-per-request`", (TooManyImages,)
    ),
    ErrorType(
        "bad_request",
        400,
        "a request the server cannot serve as sent (`stream: true`, `n` other than 1, a backend mismatch...)",
        (BadRequest,),
    ),
    ErrorType("model_not_found", 404, "under `/v1`: `model` names a model this server does not serve", (NotFound,)),
    ErrorType("not_found", 404, "no such route"),
    ErrorType("method_not_allowed", 405, "a route asked with a method it does not take (`Allow` names those it does)"),
    ErrorType(
        "overloaded",
        503,
        "full: episodes and chat requests together (`--max-queue`; `/metrics` counts them apart), body bytes "
        "that arrived (`--max-inflight-mb`: a declared `Content-Length` takes nothing; a body that crosses it "
        "mid-way is refused then, its connection closed) or requests (`--max-connections`) in progress; "
        "`Retry-After` says when to retry",
        (Overloaded,),
    ),
    ErrorType("not_ready", 503, "the server is loading, draining or failed", (NotReady,)),
    ErrorType("engine_failed", 503, "the engine died; the server reports `failed`", (EngineDead,)),
    ErrorType(
        "engine_request_failed", 503, "the engine failed this request in a way a retry may fix", (EngineRequestFailed,)
    ),
    ErrorType(
        "deadline_exceeded",
        504,
        "the request took longer than `--request-timeout-s`, or than the client's `X-Reward-Deadline-S` if "
        "shorter (in a batch: that item's error); also when the client's deadline passes while its body is "
        "still arriving (the connection is closed)",
        (DeadlineExceeded, BodyDeadline),
    ),
    ErrorType(
        "client_closed_request",
        499,
        "(logged only) the client disconnected; its engine work was aborted",
        (ClientGone,),
    ),
    ErrorType("internal_error", 500, "a fault of the server, never of the input (details only in the server log)"),
]

BY_TYPE = {e.type: e for e in ERROR_TYPES}

# exception class -> (HTTP status, error type); the first match in order wins
CLASSES: list[tuple[type[BaseException], int, str]] = [(c, e.status, e.type) for e in ERROR_TYPES for c in e.classes]


def classify(exc: BaseException) -> tuple[int, ItemError]:
    for cls, status, kind in CLASSES:
        if isinstance(exc, cls):
            return status, ItemError(type=kind, message=str(exc), retryable=status in RETRYABLE_STATUSES)
    logger.error("internal error", exc_info=exc)
    return 500, ItemError(type="internal_error", message="internal server error; the server log has the details")


OPENAI_PREFIX = "/v1/"


def render_error(status: int, error: ItemError, path: str = "", param: str | None = None) -> dict:
    """The error body for a route: OpenAI's shape under /v1, the server's own elsewhere."""
    if path.startswith(OPENAI_PREFIX):
        body = OpenAIError(message=error.message, type=openai_error_type(status), param=param, code=error.type)
        return OpenAIErrorBody(error=body).model_dump()
    return ErrorBody(error=error).model_dump()
