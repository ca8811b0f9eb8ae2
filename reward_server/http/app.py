"""The HTTP layer: `build_app(service)` wires routes, error handlers and lifespan around a service.

Routes read their own bodies (body.py): bytes are admitted as they arrive (a body that alone
exceeds the limit is refused from its Content-Length before any byte is read), raw batches
are scored while they stream in, and a client that disconnects has its work cancelled.
Authentication and request metrics are one plain ASGI middleware.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from reward_protocol import raw_batch
from reward_protocol.chat import ChatCompletionRequest, ChatCompletionResponse, ModelList, OpenAIErrorBody
from reward_protocol.score import (
    DEADLINE_HEADER,
    BatchScoreRequest,
    BatchScoreResponse,
    ErrorBody,
    FrameSpecInfo,
    HealthResponse,
    ScoreRequest,
    ScoreResponse,
)
from reward_server.api.chat import ChatCompletions
from reward_server.api.score import EpisodeScoring
from reward_server.core.service import RewardService
from reward_server.errors import RETRY_AFTER_S, BadRequest, Unauthorized, UnsupportedMediaType
from reward_server.http.body import BodyLimits, BodyReader, cancel_on_disconnect
from reward_server.http.errors import error_response, install_handlers
from reward_server.http.limits import MIB, body_limit, json_body_limit, server_limits
from reward_server.request_errors import BodyTooLarge, LengthRequired

logger = logging.getLogger(__name__)

_ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 403, 408, 411, 413, 415, 422, 500, 503, 504)}
_OPENAI_ERRORS = {code: {"model": OpenAIErrorBody} for code in (*_ERRORS, 404)}
JSON = "application/json"


def _body_schema(model, raw: bool = False) -> dict:
    """OpenAPI for a body the route reads itself (validated by `model`)."""
    content = {JSON: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    if raw:
        content[raw_batch.CONTENT_TYPE] = {
            "schema": {
                "type": "string",
                "format": "binary",
                "description": "raw batch: b'RWB1', header length (uint32 LE), RawBatchHeader JSON, frame bytes "
                "(reward_protocol/raw_batch.py)",
            }
        }
    return {"requestBody": {"required": True, "content": content}}


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


class AuthAndMetrics:
    """Plain ASGI middleware: the API key check (all routes but /health) and request counting.
    (Starlette's BaseHTTPMiddleware would wrap every body chunk and hide disconnects.)"""

    def __init__(self, app, service: RewardService):
        self.app = app
        self.service = service
        key = service.settings.api_key
        self.expected = key.encode() if key else None

    def _authorized(self, scope) -> bool:
        if self.expected is None or scope["path"] == "/health":
            return True
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # the scheme is case-insensitive (RFC 7235); the token is compared in constant time
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if not self._authorized(scope):
                raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
            await self.app(scope, receive, send_counted)
        except Exception as exc:  # anything unexpected: a 500 without internals, logged by classify
            await error_response(exc, scope.get("path", ""))(scope, receive, send_counted)
        route = scope.get("route")
        self.service.metrics.requests.labels(getattr(route, "path", "unmatched"), str(status["code"])).inc()


def _answer_head(app: FastAPI) -> None:
    """HEAD on every GET route (monitors probe with it), as GET minus the body; kept out of the
    schema. FastAPI's routes take only the methods they name; uvicorn sends no body for HEAD."""
    for route in list(app.routes):
        if isinstance(route, APIRoute) and "GET" in route.methods and "HEAD" not in route.methods:
            app.add_api_route(
                route.path,
                route.endpoint,
                methods=["HEAD"],
                response_class=route.response_class,
                include_in_schema=False,
                name=f"{route.name}_head",
            )


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

    async def handle(request: Request, allowed: tuple[str, ...], work: Callable[..., Awaitable]) -> object:
        """Check type and size, admit the body, read it while `work` runs, cancel on disconnect."""
        started = time.perf_counter()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in allowed:
            raise UnsupportedMediaType(f"content-type must be {' or '.join(allowed)}, got {ctype or 'none'!r}")
        declared = request.headers.get("content-length")
        if declared is not None and not declared.isdigit():
            raise BadRequest(f"content-length {declared!r} is not a number")
        length = int(declared) if declared is not None else None
        if length is None and ctype == raw_batch.CONTENT_TYPE:
            raise LengthRequired("a raw batch body needs a Content-Length header")
        limit = body_limit(settings, ctype)  # a JSON body only as large as a worker can parse
        if length is not None and length > limit.bytes:
            raise BodyTooLarge(limit.refusal(length))
        # the client's own deadline for this answer, when it says it (capped by --request-timeout-s)
        timeout_s = service.client_deadline(request.headers.get(DEADLINE_HEADER))
        limits = BodyLimits(
            max_bytes=limit.bytes,
            idle_timeout_s=settings.body_timeout_s,
            min_rate=settings.body_min_rate_kib_s * 1024,
            total_s=timeout_s,
        )
        reader = BodyReader(request.receive, length, limits, service.admission)
        service.admit_body(length)
        try:
            reader.start()
            answer = await cancel_on_disconnect(work(reader, started, ctype), reader)
            # A raw batch is scored from the bytes its header names, which may end before the
            # declared length: still answer only a body that arrived whole. One shorter than its
            # Content-Length is a broken upload, not partial data to score: 408 once it stalls
            # for --body-timeout-s (a client that closes instead just loses its connection).
            await reader.read_all()
            return answer
        finally:
            await reader.close()
            service.release_body()

    scoring = EpisodeScoring(service)

    @app.post("/score", response_model=ScoreResponse, responses=_ERRORS, openapi_extra=_body_schema(ScoreRequest))
    async def score(request: Request) -> ScoreResponse:
        """Judge one finished episode."""
        return await handle(request, (JSON,), lambda reader, started, _: scoring.score_json(reader, started))

    @app.post(
        "/score/batch",
        response_model=BatchScoreResponse,
        responses=_ERRORS,
        openapi_extra=_body_schema(BatchScoreRequest, raw=True),
    )
    async def score_batch(request: Request) -> BatchScoreResponse:
        """Judge many episodes together (JSON, or a raw batch of frames); a bad item is answered with
        its error, the others are scored."""

        async def work(reader: BodyReader, started: float, ctype: str) -> BatchScoreResponse:
            if ctype == raw_batch.CONTENT_TYPE:
                return await scoring.score_batch_raw(reader, started)
            return await scoring.score_batch_json(reader, started)

        return await handle(request, (JSON, raw_batch.CONTENT_TYPE), work)

    chat = ChatCompletions(service)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses=_OPENAI_ERRORS,
        openapi_extra=_body_schema(ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> ChatCompletionResponse:
        """OpenAI's chat completions (no streaming), on the same engine, admission and decode
        workers as /score: text, image_url and video_url parts; errors in OpenAI's shape."""
        return await handle(request, (JSON,), lambda reader, started, _: chat.complete(reader, started))

    @app.get("/v1/models", response_model=ModelList, responses={k: _OPENAI_ERRORS[k] for k in (401, 503)})
    async def models() -> ModelList:
        """The served model (--served-model-name); 503 until the engine serves."""
        return chat.models()

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        """200 `ok` when the engine serves; 503 `loading`, `draining` or `failed` (never needs the API key)."""
        await service.check_health()
        profile = service.profile
        body = HealthResponse(
            status=service.status,
            backend=service.backend,
            engine=service.engine.name,
            model=service.engine.model_name,
            detail=service.detail,
            score_modes=profile.available_score_modes(),
            frame_spec=FrameSpecInfo(**profile.frame_spec.to_dict()),
            limits=server_limits(settings),
        )
        code = 200 if service.status == "ok" else 503
        headers = {"Retry-After": str(RETRY_AFTER_S)} if code == 503 else None
        return JSONResponse(body.model_dump(), status_code=code, headers=headers)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text: requests by route and code, episodes by parse status, latency, admission."""
        m = service.metrics
        m.episodes_in_progress.set(service.admission.episodes)
        m.chat_in_progress.set(service.admission.chat)
        m.bytes_in_progress.set(service.admission.bytes)
        m.engine_running.set(service.engine.stats.running)
        m.decode_workers_replaced.set(service.pool.replaced)
        m.set_decoded(service.decoded.as_dict())
        m.set_engine(service.engine.stats.unusable_outputs, service.engine.memory_held())
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    @app.get("/stats")
    async def stats() -> dict:
        """Engine counters (requests, running, aborted, unusable outputs, batches) of real requests,
        memory the engine holds on purpose (vLLM's processor cache: mm_cache_*), the reclaimer's
        pauses of the event loop (reclaim_*) and the frozen start-up heap (heap_frozen_objects),
        the start-up warm-up (`warmup`: episodes, shapes, seconds; null when off) and the engine's
        patches of the library it runs (`patches`: patch, state, reason; vLLM's, checked at start)."""
        return {
            **service.engine.stats.as_dict(),
            "warmup": service.warmup.as_dict() if service.warmup else None,
            "episodes_in_progress": service.admission.episodes,
            "chat_in_progress": service.admission.chat,
            "bytes_in_progress": service.admission.bytes,
            "decode_workers_replaced": service.pool.replaced,
            **service.decoded.as_dict(),
            **(service.reclaimer.as_dict() if service.reclaimer else {}),
            "heap_frozen_objects": service.heap_frozen,
            **service.engine.memory_held(),
            "patches": service.engine.patch_table(),
        }

    async def profile(start: bool) -> dict:
        service.require_ready()  # 503 while loading: the engine and its profiler are not there yet
        engine = service.engine
        try:
            await (engine.start_profile() if start else engine.stop_profile())
        except NotImplementedError as exc:  # the engine says why it has no profiler
            raise BadRequest(
                f"profiling is off ({exc}): start the server with --engine-option profile_dir=DIR (vLLM engine), "
                "then POST /start_profile and /stop_profile around the work to trace"
            ) from None
        return {"profiling": start}

    @app.post("/start_profile", responses={code: {"model": ErrorBody} for code in (400, 503)})
    async def start_profile() -> dict:
        """Start vLLM's torch profiler in the engine (a server started with `--engine-option
        profile_dir=DIR`), as `vllm serve` does; 400 otherwise, 503 until the engine serves."""
        return await profile(True)

    @app.post("/stop_profile", responses={code: {"model": ErrorBody} for code in (400, 503)})
    async def stop_profile() -> dict:
        """Stop the profiler: the engine writes its trace under profile_dir (`python -m
        reward_tools.gpu_trace DIR` reads it)."""
        return await profile(False)

    _with_request_schemas(app, (ScoreRequest, BatchScoreRequest, ChatCompletionRequest))
    _answer_head(app)
    app.add_middleware(AuthAndMetrics, service=service)
    return app
