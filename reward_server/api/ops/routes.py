"""/health (the engine's state, the frame rule and the limits a client cuts its batches by), /metrics
(Prometheus text), /stats (engine and memory counters) and the profiler's switches, as `vllm serve` has them."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from reward_protocol.score import ErrorBody, FrameSpecInfo, HealthResponse, ServerLimits
from reward_server.core.service import RewardService
from reward_server.errors import RETRY_AFTER_S, BadRequest


def router(service: RewardService, limits: ServerLimits) -> APIRouter:
    """The routes; `limits` are what /health advertises (http/limits.server_limits)."""
    routes = APIRouter()

    @routes.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
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
            limits=limits,
        )
        code = 200 if service.status == "ok" else 503
        headers = {"Retry-After": str(RETRY_AFTER_S)} if code == 503 else None
        return JSONResponse(body.model_dump(), status_code=code, headers=headers)

    @routes.get("/metrics", response_class=Response)
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

    @routes.get("/stats")
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

    @routes.post("/start_profile", responses={code: {"model": ErrorBody} for code in (400, 503)})
    async def start_profile() -> dict:
        """Start vLLM's torch profiler in the engine (a server started with `--engine-option
        profile_dir=DIR`), as `vllm serve` does; 400 otherwise, 503 until the engine serves."""
        return await profile(True)

    @routes.post("/stop_profile", responses={code: {"model": ErrorBody} for code in (400, 503)})
    async def stop_profile() -> dict:
        """Stop the profiler: the engine writes its trace under profile_dir (`python -m
        reward_tools.gpu_trace DIR` reads it)."""
        return await profile(False)

    return routes
