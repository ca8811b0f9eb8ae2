"""Errors as HTTP answers: one handler per class of the error table (errors.py), routing errors
(no such route, wrong method) and FastAPI's own validation in the same shapes."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from reward_protocol.score import ItemError
from reward_server.errors import BY_TYPE, CLASSES, RETRY_AFTER_S, classify, render_error
from reward_server.media.decoding import InvalidBody, validation_message
from reward_server.request_errors import FieldError


def error_response(exc: BaseException, path: str = "") -> JSONResponse:
    status, error = classify(exc)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if status in (408, 411, 413):
        headers = {"Connection": "close"}  # the rest of the body is not read
    if getattr(exc, "close_connection", False):  # refused mid-body (a 503 the client retries)
        headers = {**(headers or {}), "Connection": "close"}
    param = exc.param if isinstance(exc, FieldError) else None
    return JSONResponse(render_error(status, error, path, param), status_code=status, headers=headers)


# routing errors (no such route, wrong method) in the product's shape rather than Starlette's
_HTTP_TYPES = {404: BY_TYPE["not_found"].type, 405: BY_TYPE["method_not_allowed"].type}


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
        # routes read their bodies themselves (media/decoding.py); this covers anything FastAPI validates
        return error_response(InvalidBody(validation_message(exc.errors())), request.url.path)

    app.add_exception_handler(RequestValidationError, handle_validation)
    for cls, _, _ in CLASSES:
        app.add_exception_handler(cls, handle)
