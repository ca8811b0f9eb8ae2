"""The wire schema of the reward service, shared by the server and the env-side client.

It lives here, in the light client package, so an RL env worker can build and read
messages without importing the server. Field names of `ScoreRequest` and the first
fields of `ScoreResponse` are those the earlier (seed) server used; everything after
them is an extension that old clients can ignore.
"""

from __future__ import annotations

import base64
import binascii
import unicodedata
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Limits a person can reason about; the server may be configured tighter, never looser.
MAX_TASK_TEXT_CHARS = 4096
MAX_NFRAMES = 256
MIN_MAX_PIXELS = 28 * 28  # one merged patch: anything smaller cannot be encoded
MAX_MAX_PIXELS = 16384 * 28 * 28
DEFAULT_NFRAMES = 16
DEFAULT_MAX_PIXELS = 256 * 28 * 28  # 200704: a 256x256 LIBERO frame passes unscaled
MAX_BATCH_ITEMS = 256
MAX_VIEWS = 8  # camera views of one episode (each a video item of the prompt)
MAX_VIEW_NAME_CHARS = 64

ScoreMode = Literal["auto", "percentage", "unit", "logprob", "p_true"]
SCORE_MODES: tuple[str, ...] = ("auto", "percentage", "unit", "logprob", "p_true")
# the score modes read from next-token probabilities (one prefill, no decoding, nothing parsed)
PROBABILITY_MODES: tuple[str, ...] = ("logprob", "p_true")


class ParseStatus(str, Enum):
    """How the model's answer turned into a score (or why it did not)."""

    ok = "ok"
    clamped = "clamped"  # a number was found but lay outside the scale; score clamped to [0, 1]
    missing_answer = "missing_answer"  # no complete <answer>...</answer> where one is required
    no_number = "no_number"
    multiple_numbers = "multiple_numbers"
    logprob = "logprob"  # score read from next-token probabilities, nothing parsed
    invalid_logprob = "invalid_logprob"  # the engine gave a NaN or +infinite log-probability: no score


FAILED_PARSE_STATUSES = frozenset(
    {ParseStatus.missing_answer, ParseStatus.no_number, ParseStatus.multiple_numbers, ParseStatus.invalid_logprob}
)


def _b64encode(data: bytes | memoryview) -> str:
    try:
        import pybase64

        return pybase64.b64encode(data).decode("ascii")
    except ImportError:
        return base64.b64encode(data).decode("ascii")


def _b64decode(data: str) -> bytes:
    """Strict base64 decoding; pybase64 (several times faster on megabytes of frames) when installed."""
    try:
        import pybase64

        return pybase64.b64decode(data, validate=True)
    except ImportError:
        return base64.b64decode(data, validate=True)


def wide_pixels_hint(held: int, needed: int) -> str:
    """Why a frames buffer may have the wrong size: pixels of a wider dtype than uint8."""
    for name, size in (("float16/int16", 2), ("float32/int32", 4), ("float64/int64", 8)):
        if needed and abs(held - size * needed) <= 2 * size:
            return (
                f" ({size}x: {name} pixels?); frames are uint8 on the wire: convert float frames in [0, 1] "
                "as round(x * 255) (reward_protocol.frames.as_uint8)"
            )
    return ""


def _rgb_shape(shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    t, h, w, c = shape
    if c != 3:
        raise ValueError(f"frames must be RGB with 3 channels, got {c} channels")
    if t < 1 or h < 1 or w < 1:
        raise ValueError(f"frames shape must be positive, got {list(shape)}")
    return shape


class InlineFrames(BaseModel):
    """Raw RGB frames, uint8, C-order, shape [T, H, W, 3], base64-encoded.

    The cheapest inline form for the sender: no video encoding on the env side.
    """

    model_config = ConfigDict(extra="forbid")

    shape: tuple[int, int, int, int] = Field(description="[T, H, W, 3]")
    data_b64: str = Field(description="base64 of the raw uint8 bytes, C-order")

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        return _rgb_shape(shape)

    @model_validator(mode="after")
    def _check_size(self) -> InlineFrames:
        t, h, w, c = self.shape
        expected = t * h * w * c
        # base64 length is exact up to padding: check before decoding megabytes
        approx = len(self.data_b64) * 3 // 4
        if abs(approx - expected) > 2:
            raise ValueError(
                f"frames data holds about {approx} bytes but shape {list(self.shape)} needs {expected}"
                + wide_pixels_hint(approx, expected)
            )
        return self

    @classmethod
    def from_array(cls, frames) -> InlineFrames:
        """Inline frames from an array [T, H, W, 3] (numpy, or anything numpy can read): uint8, or
        float in [0, 1] sent as round(x * 255) (reward_protocol.frames.as_uint8); other dtypes refused."""
        import numpy as np

        from reward_protocol.frames import as_uint8

        arr = np.ascontiguousarray(as_uint8(frames))
        if arr.ndim != 4:
            raise ValueError(f"frames must be [T, H, W, 3], got shape {list(arr.shape)}")
        return cls(shape=arr.shape, data_b64=_b64encode(memoryview(arr).cast("B")))

    def decode(self) -> bytes:
        try:
            raw = _b64decode(self.data_b64)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"frames.data_b64 is not valid base64: {exc}") from None
        t, h, w, c = self.shape
        if len(raw) != t * h * w * c:
            raise ValueError(f"frames data has {len(raw)} bytes, shape {list(self.shape)} needs {t * h * w * c}")
        return raw


class BackendKwargs(BaseModel):
    """Per-request scoring options. Unknown keys are refused so a typo never goes unnoticed."""

    model_config = ConfigDict(extra="forbid")

    score_mode: ScoreMode | None = Field(
        default=None,
        description="auto (the profile prompt's scale), percentage (value/100), unit (value as is), "
        "logprob (P(yes)/(P(yes)+P(no)) of the next token, no decoding), p_true (P(True)/(P(True)+P(False)) "
        "of the first answer token to a claim that the task is completed, no decoding). Default: the server's.",
    )
    p_true_threshold: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="score_mode p_true only: answer 0/1 labels, 1.0 where P(True)/(P(True)+P(False)) >= this "
        "(RLinf's TOPReward model uses 0.46); raw_value keeps the probability. Unset: the probability itself.",
    )
    prompt: str | None = Field(
        default=None,
        max_length=MAX_TASK_TEXT_CHARS * 4,
        description="Replaces the profile's question text; '{task}' is replaced by task_text.",
    )
    system_prompt: str | None = Field(default=None, max_length=MAX_TASK_TEXT_CHARS * 4)
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    ignore_eos: bool = Field(
        default=False, description="Generate exactly max_tokens (benchmarks of random-weight models)."
    )
    return_prompt: bool = Field(default=False, description="Echo the rendered prompt in the response.")


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


class ScoreOptions(BaseModel):
    """What to ask about one episode, whatever carries its video."""

    model_config = ConfigDict(extra="forbid")

    task_text: str = Field(min_length=1, max_length=MAX_TASK_TEXT_CHARS, description="The task instruction.")
    nframes: int = Field(
        default=DEFAULT_NFRAMES,
        ge=1,
        le=MAX_NFRAMES,
        description="Frames to show the model, spread evenly over the episode. Normalized to an even "
        "count >= 2 (Qwen2.5-VL groups frames in pairs); short videos repeat their last frame.",
    )
    max_pixels: int = Field(
        default=DEFAULT_MAX_PIXELS,
        ge=MIN_MAX_PIXELS,
        le=MAX_MAX_PIXELS,
        description="Upper bound of H*W per frame; frames are resized to multiples of 28.",
    )
    backend: str | None = Field(default=None, max_length=128, description="Must name the server's backend when given.")
    backend_kwargs: BackendKwargs = Field(default_factory=BackendKwargs)
    request_id: str | None = Field(default=None, max_length=128)
    progress_points: int = Field(
        default=1,
        ge=1,
        le=MAX_NFRAMES,
        description="1: one score for the whole episode. K > 1: a progress curve of K values, point k "
        "judging the frames [0, ceil(k*T/K)) of the T frames the model sees (reward_protocol.progress); "
        "K must not exceed T (nor the server's --max-progress-points).",
    )

    @field_validator("task_text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("task_text is blank; send the task instruction")
        return value

    @field_validator("backend_kwargs", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value


class ViewFrames(BaseModel):
    """One camera view of an episode, inline: its name (shown to the model) and its frames."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_VIEW_NAME_CHARS, description="e.g. 'main camera'")
    frames: InlineFrames


def _one_source(item: ScoreOptions, sources: tuple[str, ...]) -> None:
    """Exactly one of an episode's video sources is given; several views are checked as such."""
    given = [name for name in sources if getattr(item, name) is not None]
    if len(given) != 1:
        raise ValueError(
            f"exactly one of {', '.join(sources)} must be given"
            + (f" (got {', '.join(given)})" if given else " (got none)")
        )
    if given == ["views"]:
        _check_views(item.views, item.progress_points)


def _check_views(views: list, progress_points: int) -> None:
    check_view_layout([view.name for view in views], [view.frames.shape[0] for view in views], progress_points)


def check_view_layout(names: list[str], frame_counts: list[int], progress_points: int = 1) -> None:
    """Several views of one episode, as a request may carry them, else ValueError saying what is
    wrong: 2..MAX_VIEWS views with distinct names that read as one line of the prompt (not blank,
    no line break or other control character), the same frame count (the same moments, so the
    server picks the same steps from each); one score, not a curve. The client checks an
    episode's views with it before sending them (reward_client.rlinf.judging)."""
    if progress_points > 1:
        raise ValueError(
            f"progress_points {progress_points} with several views is not offered: a curve is drawn over one "
            "view (send one view, or progress_points 1)"
        )
    if not 2 <= len(names) <= MAX_VIEWS:
        raise ValueError(f"several views are 2 to {MAX_VIEWS} views, got {len(names)} ({names})")
    for name in names:
        if not name.strip():
            raise ValueError(f"a view name is blank ({name!r}); name the camera (e.g. 'main camera')")
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name):
            raise ValueError(
                f"view name {name!r} holds a line break or control character; a name is one line of printable text"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"views must have distinct names (got {names})")
    if len(set(frame_counts)) != 1:
        raise ValueError(
            f"views must have the same number of frames, the same moments of the episode (got {frame_counts})"
        )


class ScoreRequest(ScoreOptions):
    """One finished episode to judge (JSON body). Exactly one video source must be given."""

    video_path: str | None = Field(
        default=None,
        max_length=4096,
        description="A video file on the server's filesystem, under one of its allowed roots.",
    )
    video_b64: str | None = Field(default=None, description="An encoded video file (e.g. MP4), base64.")
    frames: InlineFrames | None = Field(default=None, description="Raw RGB frames, inline.")
    views: list[ViewFrames] | None = Field(
        default=None,
        min_length=2,
        max_length=MAX_VIEWS,
        description="Several camera views of the episode, raw RGB frames inline, each named; the model sees "
        "one video per view, in this order, each labelled with its name (instead of frames).",
    )

    @field_validator("video_path")
    @classmethod
    def _path_has_no_nul(cls, value: str | None) -> str | None:
        return _no_nul(value)

    @model_validator(mode="after")
    def _one_video_source(self) -> ScoreRequest:
        _one_source(self, ("video_path", "video_b64", "frames", "views"))
        return self


class FramesRef(BaseModel):
    """Raw RGB uint8 frames [T, H, W, 3], C-order, at `offset` in a raw batch body's payload."""

    model_config = ConfigDict(extra="forbid")

    shape: tuple[int, int, int, int] = Field(description="[T, H, W, 3]")
    offset: int = Field(ge=0, description="byte offset into the payload")

    @field_validator("shape")
    @classmethod
    def _check_shape(cls, shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        return _rgb_shape(shape)

    @property
    def nbytes(self) -> int:
        t, h, w, c = self.shape
        return t * h * w * c


class ViewRef(BaseModel):
    """One camera view of a raw batch episode: its name and its frames in the payload."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_VIEW_NAME_CHARS, description="e.g. 'main camera'")
    frames: FramesRef


class RawScoreItem(ScoreOptions):
    """One episode of a raw batch body: its frames in the payload (one view, or several named
    views), or a server-side video_path."""

    frames: FramesRef | None = None
    video_path: str | None = Field(default=None, max_length=4096)
    views: list[ViewRef] | None = Field(default=None, min_length=2, max_length=MAX_VIEWS)

    @field_validator("video_path")
    @classmethod
    def _path_has_no_nul(cls, value: str | None) -> str | None:
        return _no_nul(value)

    @model_validator(mode="after")
    def _one_video_source(self) -> RawScoreItem:
        _one_source(self, ("frames", "video_path", "views"))
        return self

    def frame_refs(self) -> list[FramesRef]:
        """Every frames region of the payload this item names (one per view)."""
        if self.views is not None:
            return [view.frames for view in self.views]
        return [self.frames] if self.frames is not None else []


class RawBatchHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[RawScoreItem] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


class Timings(BaseModel):
    """Where one episode's time went, in milliseconds from the moment its request arrived."""

    queue_ms: float = Field(0.0, description="waiting inside the engine before it was scheduled")
    preprocess_ms: float = Field(0.0, description="arrival until the frames were model-ready (receive + prepare)")
    engine_ms: float = Field(0.0, description="in the engine: input processing, queue, model")
    total_ms: float = 0.0
    receive_ms: float = Field(0.0, description="arrival until this episode's bytes (or its body) had arrived")
    prepare_ms: float = Field(0.0, description="parsing, decoding, picking and resizing its frames")
    input_ms: float = Field(0.0, description="inside engine_ms: the engine's input processing (the model's processor)")
    prefill_ms: float = Field(
        0.0, description="inside engine_ms, by the engine's clock: scheduled until its first new token (the prompt)"
    )
    decode_ms: float = Field(0.0, description="inside engine_ms, by the engine's clock: first to last new token")


class ScoreResponse(BaseModel):
    """The judgement of one episode. `score` is in [0, 1], or null with `parse_status` saying why."""

    score: float | None = Field(
        description="In [0, 1]; null when the model's answer could not be parsed. With a curve: its last point."
    )
    model_output: str = Field(description="The model's raw text ('' in logprob mode); with a curve, the last point's.")
    backend: str
    parse_status: ParseStatus
    parse_error: str | None = None
    raw_value: float | None = Field(default=None, description="The number read from the answer, before scaling.")
    score_mode: ScoreMode
    nframes: int = Field(description="Frames the model saw, after normalization.")
    prompt_tokens: int | None = Field(default=None, description="Prompt tokens (all points' together for a curve).")
    output_tokens: int | None = None
    timings: Timings = Field(default_factory=Timings)
    request_id: str | None = None
    prompt: str | None = Field(
        default=None, description="The rendered prompt, when return_prompt was asked (a curve: the last point's)."
    )
    progress: list[float | None] | None = Field(
        default=None,
        description="With progress_points K > 1: K values in [0, 1], point k for the prefix of frames "
        "[0, ceil(k*T/K)); null where that point's answer could not be parsed. `score` is the last one.",
    )
    cached_tokens: int | None = Field(
        default=None,
        description="Prompt tokens the engine took from its prefix cache instead of computing (where it says).",
    )


class BatchScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[ScoreRequest] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})

# Request header: the seconds the client still waits for this answer. The server ends the request
# there (capped by its --request-timeout-s), answering what is done and the rest as retryable
# `deadline_exceeded` item errors, rather than working on for a client that has gone.
DEADLINE_HEADER = "X-Reward-Deadline-S"


class ItemError(BaseModel):
    type: str
    message: str
    retryable: bool = Field(
        default=False,
        description="true when sending the same request (or batch item) again can succeed: the server was "
        "full, not ready, or the engine failed this request or ran out of time (engine_request_failed, "
        "deadline_exceeded, overloaded, not_ready...). false when the request itself must change. The "
        "client (reward_client.client) resends exactly these, within its deadline.",
    )


class BatchItem(BaseModel):
    """One entry of a batch answer: a response, or the error that item met."""

    index: int
    response: ScoreResponse | None = None
    error: ItemError | None = None


class BatchScoreResponse(BaseModel):
    results: list[BatchItem]


HealthStatus = Literal["ok", "loading", "draining", "failed"]


class FrameSpecInfo(BaseModel):
    """The frame layout the server's model wants (reward_protocol.frames.FrameSpec)."""

    pixel_factor: int
    temporal_factor: int
    min_pixels: int
    max_aspect_ratio: float


class ServerLimits(BaseModel):
    """What one request to this server may hold; the client cuts a batch to fit (reward_client.client)."""

    max_json_body_bytes: int = Field(
        description="largest JSON body (the smaller of --max-body-mb, --decode-memory-mb / 16, --max-inflight-mb)"
    )
    max_raw_body_bytes: int = Field(description="largest raw batch body (--max-body-mb, --max-inflight-mb)")
    max_batch_items: int = Field(description="episodes one batch may hold (--max-queue, and the protocol's 256)")
    request_timeout_s: float = Field(
        description="the longest the server works on one request (--request-timeout-s); a client's "
        "X-Reward-Deadline-S header shortens it"
    )


class HealthResponse(BaseModel):
    status: HealthStatus
    backend: str
    engine: str
    model: str
    detail: str | None = None
    score_modes: list[str] | None = Field(default=None, description="score modes this server offers")
    frame_spec: FrameSpecInfo | None = None
    limits: ServerLimits | None = Field(default=None, description="request size and time limits")


class ErrorBody(BaseModel):
    """Every error the server returns has this shape."""

    error: ItemError
