"""Error classes and how each becomes an HTTP answer (one handler per class, no internals leaked)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reward_client.openai_chat import OpenAIError, OpenAIErrorBody, openai_error_type
from reward_client.progress import ProgressPointsError
from reward_client.protocol import ErrorBody, ItemError
from reward_server.admission import Overloaded, TooMuchForServer
from reward_server.body import BodyTimeout, BodyTooLarge, ClientGone, LengthRequired
from reward_server.decode_pool import WorkerDied
from reward_server.decoding import InvalidBody, validation_message
from reward_server.engines.base import AnswerWordsUnsupported, EngineDead, EngineInputRejected, EngineRequestFailed
from reward_server.images import ImageError, ImageTooLarge
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


class NotFound(LookupError):
    """The request names something this server does not have (a model under /v1)."""


class TooManyImages(BadRequest):
    """More images in one chat request than --max-images-per-request."""


# exception class -> (HTTP status, error type); the first match in order wins
_CLASSES: list[tuple[type[BaseException], int, str]] = [
    (Unauthorized, 401, "unauthorized"),
    (InvalidBody, 422, "invalid_request"),
    (ProgressPointsError, 422, "invalid_request"),
    (BodyTooLarge, 413, "body_too_large"),
    (TooMuchForServer, 413, "request_too_large"),
    (LengthRequired, 411, "length_required"),
    (BodyTimeout, 408, "body_timeout"),
    (UnsupportedMediaType, 415, "unsupported_media_type"),
    (PathNotAllowed, 403, "path_not_allowed"),
    (ImageTooLarge, 413, "image_too_large"),
    (ImageError, 400, "invalid_image"),
    (VideoTooLarge, 413, "video_too_large"),
    (VideoError, 400, "invalid_video"),
    (WorkerDied, 400, "invalid_video"),
    (UnknownBackend, 400, "unknown_backend"),
    (AnswerWordsUnsupported, 400, "unsupported_option"),
    (UnsupportedOption, 400, "unsupported_option"),
    (EngineInputRejected, 400, "input_rejected"),
    (TooManyImages, 400, "too_many_images"),
    (BadRequest, 400, "bad_request"),
    (NotFound, 404, "model_not_found"),
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


OPENAI_PREFIX = "/v1/"


def render_error(status: int, error: ItemError, path: str = "", param: str | None = None) -> dict:
    """The error body for a route: OpenAI's shape under /v1, the server's own elsewhere."""
    if path.startswith(OPENAI_PREFIX):
        body = OpenAIError(message=error.message, type=openai_error_type(status), param=param, code=error.type)
        return OpenAIErrorBody(error=body).model_dump()
    return ErrorBody(error=error).model_dump()


def error_response(exc: BaseException, path: str = "") -> JSONResponse:
    status, error = classify(exc)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if status in (408, 411, 413):
        headers = {"Connection": "close"}  # the rest of the body is not read
    param = getattr(exc, "param", None)
    return JSONResponse(render_error(status, error, path, param), status_code=status, headers=headers)


# routing errors (no such route, wrong method) in the product's shape rather than Starlette's
_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}


def install_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, request.url.path)

    async def handle_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path, status = request.url.path, exc.status_code
        if status == 404:
            message = f"no route {path!r}; GET /openapi.json lists the routes"
        elif status == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            message = f"{request.method} is not allowed on {path!r}" + (f"; allowed: {allowed}" if allowed else "")
        else:
            message = str(exc.detail)
        error = ItemError(type=_HTTP_TYPES.get(status, "http_error"), message=message)
        return JSONResponse(render_error(status, error, path), status_code=status, headers=exc.headers)

    app.add_exception_handler(StarletteHTTPException, handle_http)

    async def handle_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # routes read their bodies themselves (decoding.py); this covers anything FastAPI validates
        return error_response(InvalidBody(validation_message(exc.errors())), request.url.path)

    app.add_exception_handler(RequestValidationError, handle_validation)
    for cls, _, _ in _CLASSES:
        app.add_exception_handler(cls, handle)
