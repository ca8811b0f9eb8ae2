"""The HTTP layer: `build_app(service)` wires routes, error handlers and lifespan around a service."""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from reward_client.protocol import (
    BatchScoreRequest,
    BatchScoreResponse,
    ErrorBody,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
)
from reward_server.errors import (
    RETRY_AFTER_S,
    BodyTooLarge,
    Unauthorized,
    UnsupportedMediaType,
    error_response,
    install_handlers,
)
from reward_server.service import ScoringService

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 413, 415, 422, 500, 503, 504)}


def _body_schema(model) -> dict:
    """OpenAPI for a body the route reads itself (parsed off the event loop, validated by `model`)."""
    name = model.__name__
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


def _with_request_schemas(app: FastAPI, models: tuple) -> None:
    """Add the request models (and what they reference) to the app's OpenAPI components."""
    base = app.openapi

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in js.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def build_app(service: ScoringService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Load in the background so /health answers `loading` meanwhile.
        loader = asyncio.create_task(service.start(), name="engine-start")
        try:
            yield
        finally:
            loader.cancel()
            await service.stop()

    app = FastAPI(
        title="VLM reward server",
        description="Judges finished robot episodes with a vision-language model.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.service = service
    install_handlers(app)

    expected_auth = f"Bearer {service.settings.api_key}" if service.settings.api_key else None

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        try:
            if expected_auth and request.url.path != "/health":
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), expected_auth.encode()):
                    raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
            response = await call_next(request)
        except Exception as exc:  # anything unexpected: a 500 without internals, logged here
            response = error_response(exc)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        service.metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    max_body = int(service.settings.max_body_mb * 1024 * 1024)

    async def read_json_body(request: Request) -> bytes:
        """The raw body, checked for type and size; parsing happens in the decoder pool."""
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip().lower() != "application/json":
            raise UnsupportedMediaType(f"content-type must be application/json, got {ctype or 'none'!r}")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            raise BodyTooLarge(f"body of {int(declared)} bytes exceeds the limit of {max_body} bytes (--max-body-mb)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise BodyTooLarge(f"body exceeds the limit of {max_body} bytes (--max-body-mb)")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.post("/score", response_model=ScoreResponse, responses=_ERRORS, openapi_extra=_body_schema(ScoreRequest))
    async def score(request: Request) -> ScoreResponse:
        """Judge one finished episode."""
        return await service.score_body(await read_json_body(request))

    @app.post(
        "/score/batch",
        response_model=BatchScoreResponse,
        responses=_ERRORS,
        openapi_extra=_body_schema(BatchScoreRequest),
    )
    async def score_batch(request: Request) -> BatchScoreResponse:
        """Judge many episodes together; a bad item is answered with its error, the others are scored."""
        return await service.score_batch_body(await read_json_body(request))

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        """200 `ok` when the engine serves; 503 `loading`, `draining` or `failed` (never needs the API key)."""
        await service.check_health()
        body = HealthResponse(
            status=service.status,
            backend=service.backend,
            engine=service.engine.name,
            model=service.engine.model_name,
            detail=service.detail,
        )
        code = 200 if service.status == "ok" else 503
        headers = {"Retry-After": str(RETRY_AFTER_S)} if code == 503 else None
        return JSONResponse(body.model_dump(), status_code=code, headers=headers)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text: requests by route and code, episodes by parse status, batch sizes, latency."""
        m = service.metrics
        m.queue_depth.set(service.batcher.queued)
        m.in_flight.set(service.batcher.in_flight)
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    @app.get("/stats")
    async def stats() -> dict:
        """Engine-level counters (batch sizes the engine saw); for tests and debugging."""
        s = service.engine.stats
        return {
            "batches": s.batches,
            "requests": s.requests,
            "max_batch_size": s.max_batch_size,
            "max_running": s.max_running,
        }

    _with_request_schemas(app, (ScoreRequest, BatchScoreRequest))
    return app
