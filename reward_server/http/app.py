"""The HTTP layer's assembly: `build_app(service)` puts the lifespan, the error handlers, one router per
API feature (api/score, api/chat, api/ops), the OpenAPI additions and the middleware around a service.

Routes read their own bodies through one intake (intake.py, body.py): bytes are admitted as they
arrive (a body that alone exceeds the limit is refused from its Content-Length before any byte is
read), raw batches are scored while they stream in, and a client that disconnects has its work
cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from reward_protocol.chat import ChatCompletionRequest
from reward_protocol.score import BatchScoreRequest, ScoreRequest
from reward_server.api.chat import routes as chat_routes
from reward_server.api.ops import routes as ops_routes
from reward_server.api.score import routes as score_routes
from reward_server.core.service import RewardService
from reward_server.http.errors import install_handlers
from reward_server.http.intake import BodyIntake
from reward_server.http.limits import MIB, json_body_limit, server_limits
from reward_server.http.middleware import AuthAndMetrics
from reward_server.http.openapi import answer_head, with_request_schemas

logger = logging.getLogger(__name__)


def build_app(service: RewardService) -> FastAPI:
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
        version="0.2.0",
        lifespan=lifespan,
    )
    app.state.service = service
    install_handlers(app)
    settings = service.settings
    if json_body_limit(settings) < settings.max_body_mb * MIB:
        logger.info(
            "JSON bodies are accepted up to %.0f MiB (what a decode worker parses within --decode-memory-mb %d); "
            "raw batches up to --max-body-mb %g",
            json_body_limit(settings) / MIB,
            settings.decode_memory_mb,
            settings.max_body_mb,
        )
    intake = BodyIntake(service)
    app.include_router(score_routes.router(service, intake))
    app.include_router(chat_routes.router(service, intake))
    app.include_router(ops_routes.router(service, server_limits(settings)))
    with_request_schemas(app, (ScoreRequest, BatchScoreRequest, ChatCompletionRequest))
    answer_head(app)
    app.add_middleware(AuthAndMetrics, service=service)
    return app
