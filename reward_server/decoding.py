"""Request bodies -> validated requests + model-ready frames, off the event loop.

A request carries megabytes (16 raw 256x256 frames are 4 MB of base64). Parsing the JSON,
validating it, decoding the frames and fitting them to the model grid costs ~10-15 ms of CPU
per episode; in the server's own process that work would hold the GIL that vLLM's input
processing needs. `Decoder` runs it in worker processes (or threads, for small setups) and
sends back only the frames and the request without its video payload.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ValidationError

from reward_client.protocol import BatchScoreRequest, ScoreRequest
from reward_server.video import (
    decode_b64_video,
    decode_video,
    frames_from_inline,
    prepare_frames,
    resolve_video_path,
)


class InvalidBody(ValueError):
    """The body is not valid JSON for this route, or fails validation; the message names the field."""


@dataclass
class Decoded:
    request: ScoreRequest  # without its inline video (already decoded into `video`)
    video: np.ndarray | None
    error: Exception | None = None  # a per-item problem (batch form): reported in the item's place


def _loads(body: bytes):
    try:
        import orjson

        return orjson.loads(body)
    except ImportError:
        return json.loads(body)


def validation_message(errors: list) -> str:
    """One line naming each failing field and what is wrong with it (pydantic's error list)."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        msg = "unknown field (not part of the API)" if err.get("type") == "extra_forbidden" else err.get("msg", "")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts) or "invalid request body"


def _parse(model: type[BaseModel], body: bytes) -> BaseModel:
    try:
        data = _loads(body)
    except ValueError as exc:
        raise InvalidBody(f"body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidBody(validation_message(exc.errors())) from None


def frames_for(req: ScoreRequest, roots: Sequence[str]) -> np.ndarray:
    """The episode's frames, sampled to req.nframes (normalized) and fitted to req.max_pixels."""
    if req.video_path is not None:
        frames = decode_video(resolve_video_path(req.video_path, roots))
    elif req.video_b64 is not None:
        frames = decode_b64_video(req.video_b64)
    else:
        assert req.frames is not None
        frames = frames_from_inline(req.frames)
    return prepare_frames(frames, req.nframes, req.max_pixels)


def _decode_item(req: ScoreRequest, roots: Sequence[str]) -> Decoded:
    light = req.model_copy(update={"frames": None, "video_b64": None})
    try:
        return Decoded(light, frames_for(req, roots))
    except ValueError as exc:  # VideoError and friends: the item's own problem
        return Decoded(light, None, exc)


def decode_score(body: bytes, roots: Sequence[str]) -> Decoded:
    return _decode_item(_parse(ScoreRequest, body), roots)


def decode_batch(body: bytes, roots: Sequence[str]) -> list[Decoded]:
    batch = _parse(BatchScoreRequest, body)
    return [_decode_item(req, roots) for req in batch.requests]


class Decoder:
    """Runs decode_score / decode_batch in a pool; processes unless workers == 0 (threads)."""

    def __init__(self, workers: int, roots: Sequence[str]):
        self.roots = list(roots)
        self.pool: Executor
        if workers > 0:
            # spawn: never fork a process that holds CUDA contexts or vLLM's threads
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        else:
            self.pool = ThreadPoolExecutor(max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="decode")

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
