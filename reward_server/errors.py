"""Error classes and how each becomes an HTTP answer (one handler per class, no internals leaked)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from reward_client.protocol import ErrorBody, ItemError
from reward_server.admission import Overloaded, TooMuchForServer
from reward_server.body import BodyTimeout, BodyTooLarge, ClientGone, LengthRequired
from reward_server.decode_pool import WorkerDied
from reward_server.decoding import InvalidBody, validation_message
from reward_server.engines.base import AnswerWordsUnsupported, EngineDead, EngineRequestFailed
from reward_server.profiles import UnknownBackend, UnsupportedOption
from reward_server.video import PathNotAllowed, VideoError, VideoTooLarge

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class BadRequest(ValueError):
    """The request cannot be served as sent; the message says what to change."""

    type = "bad_request"


class UnsupportedMediaType(ValueError):
    pass


class Unauthorized(PermissionError):
    pass


class NotReady(RuntimeError):
    """The server is loading, draining or failed."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class DeadlineExceeded(TimeoutError):
    pass


# exception class -> (HTTP status, error type); the first match in order wins
_CLASSES: list[tuple[type[BaseException], int, str]] = [
    (Unauthorized, 401, "unauthorized"),
    (InvalidBody, 422, "invalid_request"),
    (BodyTooLarge, 413, "body_too_large"),
    (TooMuchForServer, 413, "request_too_large"),
    (LengthRequired, 411, "length_required"),
    (BodyTimeout, 408, "body_timeout"),
    (UnsupportedMediaType, 415, "unsupported_media_type"),
    (PathNotAllowed, 403, "path_not_allowed"),
    (VideoTooLarge, 413, "video_too_large"),
    (VideoError, 400, "invalid_video"),
    (WorkerDied, 400, "invalid_video"),
    (UnknownBackend, 400, "unknown_backend"),
    (AnswerWordsUnsupported, 400, "unsupported_option"),
    (UnsupportedOption, 400, "unsupported_option"),
    (BadRequest, 400, "bad_request"),
    (Overloaded, 503, "overloaded"),
    (NotReady, 503, "not_ready"),
    (EngineDead, 503, "engine_failed"),
    (EngineRequestFailed, 503, "engine_request_failed"),
    (DeadlineExceeded, 504, "deadline_exceeded"),
    (ClientGone, 499, "client_closed_request"),
]


def classify(exc: BaseException) -> tuple[int, ItemError]:
    for cls, status, kind in _CLASSES:
        if isinstance(exc, cls):
            return status, ItemError(type=kind, message=str(exc))
    logger.error("internal error", exc_info=exc)
    return 500, ItemError(type="internal_error", message="internal server error; the server log has the details")


def error_response(exc: BaseException) -> JSONResponse:
    status, error = classify(exc)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if status in (408, 411, 413):
        headers = {"Connection": "close"}  # the rest of the body is not read
    return JSONResponse(ErrorBody(error=error).model_dump(), status_code=status, headers=headers)


def install_handlers(app: FastAPI) -> None:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def handle_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # routes read their bodies themselves (decoding.py); this covers anything FastAPI validates
        return error_response(InvalidBody(validation_message(exc.errors())))

    app.add_exception_handler(RequestValidationError, handle_validation)
    for cls, _, _ in _CLASSES:
        app.add_exception_handler(cls, handle)
