"""Scoring one episode or many: video -> frames -> profile -> batcher/engine -> parser.

The service owns the server's lifecycle state (loading / ok / draining / failed) so the HTTP
layer only translates.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

from reward_client.protocol import (
    FAILED_PARSE_STATUSES,
    BatchItem,
    BatchScoreResponse,
    HealthStatus,
    ScoreResponse,
    Timings,
)
from reward_server.batching import Batcher
from reward_server.decoding import Decoded, Decoder, decode_batch, decode_score
from reward_server.engines.base import Engine, EngineDead
from reward_server.errors import BadRequest, DeadlineExceeded, NotReady, classify
from reward_server.metrics import Metrics
from reward_server.profiles import Profile, canonical_backend
from reward_server.settings import ServerSettings

logger = logging.getLogger(__name__)


class ScoringService:
    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine,
        profile: Profile,
        metrics: Metrics | None = None,
        on_failure: Callable[[str], None] | None = None,
    ):
        self.settings = settings
        self.engine = engine
        self.profile = profile
        self.metrics = metrics or Metrics()
        self.status: HealthStatus = "loading"
        self.detail: str | None = None
        self.active = 0  # requests being handled (decoding, queued or in the engine)
        self._on_failure = on_failure
        self.decoder = Decoder(settings.effective_decode_workers(), settings.video_roots)
        self.batcher = Batcher(
            engine,
            max_batch_size=settings.max_batch_size,
            batch_wait_ms=settings.effective_batch_wait_ms(),
            max_queue=settings.max_queue,
            on_batch=self.metrics.batch_size.observe,
            on_engine_dead=self.fail,
        )

    @property
    def backend(self) -> str:
        return self.profile.name

    async def start(self) -> None:
        """Load the engine; on failure the status says `failed` and the failure hook runs."""
        started = time.perf_counter()
        try:
            await self.engine.start()
        except Exception as exc:
            logger.exception("engine %s could not load %s", self.engine.name, self.engine.model_name)
            self.fail(f"engine could not start: {type(exc).__name__}: {exc}")
            return
        self.batcher.start()
        self.status = "ok"
        logger.info(
            "ready: backend=%s engine=%s model=%s (%.1f s)",
            self.backend,
            self.engine.name,
            self.engine.model_name,
            time.perf_counter() - started,
        )

    def fail(self, detail: str) -> None:
        if self.status == "failed":
            return
        self.status = "failed"
        self.detail = detail
        logger.error("reward server failed: %s", detail)
        if self._on_failure:
            self._on_failure(detail)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait for the requests in hand; True if they all finished in time."""
        if self.status == "ok":
            self.status = "draining"
            self.detail = "shutting down: finishing requests in progress"
        logger.info("draining: %d requests in progress, up to %.0f s", self.active, timeout_s)
        deadline = time.monotonic() + timeout_s
        while self.active > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.active:
            logger.warning("drain timed out with %d requests still in progress", self.active)
        return self.active == 0

    async def check_health(self) -> None:
        if self.status == "ok":
            try:
                await self.engine.check_health()
            except EngineDead as exc:
                self.fail(str(exc))

    async def stop(self) -> None:
        await self.batcher.stop()
        await self.engine.shutdown()
        self.decoder.shutdown()

    def _require_ready(self) -> None:
        if self.status != "ok":
            raise NotReady(
                self.status, f"the reward server is {self.status}" + (f": {self.detail}" if self.detail else "")
            )

    def _check_backend(self, requested: str | None) -> None:
        if requested is None:
            return
        if canonical_backend(requested) != self.backend:
            raise BadRequest(
                f"this server runs backend {self.backend!r}; request asked for {requested!r}. "
                f"Omit 'backend' or start a server with --backend {requested}"
            )

    async def _decode(self, fn, body: bytes):
        return await asyncio.get_running_loop().run_in_executor(self.decoder.pool, fn, body, self.decoder.roots)

    async def _deadline(self, coro):
        try:
            return await asyncio.wait_for(coro, self.settings.request_timeout_s)
        except TimeoutError:
            raise DeadlineExceeded(f"scoring took longer than {self.settings.request_timeout_s:g} s") from None

    async def _handle(self, coro):
        """Admit one request (refused unless ok), count it while in progress, apply the deadline."""
        if self.status != "ok":
            coro.close()
            self._require_ready()
        self.active += 1
        try:
            return await self._deadline(coro)
        finally:
            self.active -= 1

    async def score_body(self, body: bytes) -> ScoreResponse:
        """Score one episode from a /score request body."""
        started = time.perf_counter()

        async def run() -> ScoreResponse:
            decoded = await self._decode(decode_score, body)
            return await self._score(decoded, started)

        return await self._handle(run())

    async def score_batch_body(self, body: bytes) -> BatchScoreResponse:
        """Score many episodes together; a bad item is reported in its place, the rest still scored."""
        started = time.perf_counter()

        async def run() -> list:
            items = await self._decode(decode_batch, body)
            return await asyncio.gather(*(self._score(item, started) for item in items), return_exceptions=True)

        results = await self._handle(run())
        out = []
        for index, result in enumerate(results):
            if isinstance(result, ScoreResponse):
                out.append(BatchItem(index=index, response=result))
            else:
                if isinstance(result, (NotReady, EngineDead)):
                    raise result
                _, error = classify(result)
                out.append(BatchItem(index=index, error=error))
        return BatchScoreResponse(results=out)

    async def _score(self, decoded: Decoded, started: float) -> ScoreResponse:
        if decoded.error is not None:
            raise decoded.error
        req, video = decoded.request, decoded.video
        self._check_backend(req.backend)
        kwargs = req.backend_kwargs
        score_mode = self.profile.resolve_score_mode(kwargs)
        prepared = time.perf_counter()
        engine_request = self.profile.build(req.task_text, video, kwargs, score_mode)
        engine_request.request_id = uuid.uuid4().hex  # clients may reuse their own ids; the engine may not
        output, queue_ms = await self.batcher.submit(engine_request)
        parsed = self.profile.parse(output, score_mode)
        total = time.perf_counter() - started
        self.metrics.episodes.labels(parsed.status.value).inc()
        if parsed.status in FAILED_PARSE_STATUSES:
            self.metrics.parse_failures.labels(parsed.status.value).inc()
        self.metrics.latency.observe(total)
        self.metrics.engine_latency.observe(output.engine_ms / 1000)
        return ScoreResponse(
            score=parsed.score,
            model_output=output.text,
            backend=self.backend,
            parse_status=parsed.status,
            parse_error=parsed.error,
            raw_value=parsed.raw_value,
            score_mode=score_mode,
            nframes=len(video),
            prompt_tokens=output.prompt_tokens,
            output_tokens=output.output_tokens,
            timings=Timings(
                preprocess_ms=(prepared - started) * 1000,
                queue_ms=queue_ms,
                engine_ms=output.engine_ms,
                total_ms=total * 1000,
            ),
            request_id=req.request_id,
            prompt=output.prompt if kwargs.return_prompt else None,
        )
