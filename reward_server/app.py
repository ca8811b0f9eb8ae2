"""The HTTP layer: `build_app(service)` wires routes, error handlers and lifespan around a service."""

from __future__ import annotations

import asyncio
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
from reward_server.errors import RETRY_AFTER_S, error_response, install_handlers
from reward_server.service import ScoringService

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorBody} for code in (400, 403, 422, 500, 503, 504)}


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

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        try:
            response = await call_next(request)
        except Exception as exc:  # anything unexpected: a 500 without internals, logged here
            response = error_response(exc)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        service.metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    @app.post("/score", response_model=ScoreResponse, responses=_ERRORS)
    async def score(body: ScoreRequest) -> ScoreResponse:
        return await service.score(body)

    @app.post("/score/batch", response_model=BatchScoreResponse, responses=_ERRORS)
    async def score_batch(body: BatchScoreRequest) -> BatchScoreResponse:
        return await service.score_batch(body)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
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

    return app
