"""The server's one core behind every route: lifecycle, admission, deadlines, the engine.

It owns the server's lifecycle state (loading / ok / draining / failed), the resources every
route shares (the engine, the profile, the decode workers and their budgets, the metrics) and
the one entry by which work reaches the engine (`run`): admission (--max-queue), the request's
deadline (--request-timeout-s, or the client's shorter X-Reward-Deadline-S; a 504 naming it),
cancellation when the client leaves. The API
dialects (api/score.py, api/chat.py) translate their protocol around it; the HTTP layer only
reads bodies and translates errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from reward_protocol.score import PROBABILITY_MODES, HealthStatus
from reward_server.core.admission import Admission, WorkKind
from reward_server.core.deadline import Deadline
from reward_server.core.metrics import Metrics
from reward_server.core.warmup import WarmupReport, warm_up
from reward_server.engines.base import AnswerWordsUnsupported, Engine, EngineDead
from reward_server.engines.generation_defaults import check_checkpoint
from reward_server.media.decode_pool import DecodePool, PoolBudget
from reward_server.media.decoded_budget import DecodedBudget
from reward_server.media.decoding import Preparer
from reward_server.media.memory_release import Reclaimer, freeze_startup_heap
from reward_server.media.video import DecodeLimits
from reward_server.profiles import Profile
from reward_server.settings import ServerSettings

logger = logging.getLogger(__name__)


class NotReady(RuntimeError):
    """The server is loading, draining or failed."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class DeadlineExceeded(TimeoutError):
    """The request's deadline passed before its answer was ready."""


T = TypeVar("T")


class RewardService:
    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine,
        profile: Profile,
        metrics: Metrics | None = None,
        on_failure: Callable[[str], None] | None = None,
        freeze_heap: bool = False,
    ):
        self.settings = settings
        # the process is the service's alone (bootstrap.build_service(owns_process=True)) and --freeze-heap
        self.freeze_heap = freeze_heap and settings.freeze_heap
        self.heap_frozen = 0  # objects frozen once warm (freeze_startup_heap)
        self.engine = engine
        self.profile = profile
        self.metrics = metrics or Metrics()
        self.status: HealthStatus = "loading"
        self.detail: str | None = None
        self.warmup: WarmupReport | None = None
        self.active = 0  # requests being handled
        self._on_failure = on_failure
        self.admission = Admission(settings.max_queue, int(settings.effective_max_inflight_mb() * 1024 * 1024))
        self.pool = DecodePool(
            settings.effective_decode_workers(), PoolBudget(settings.decode_timeout_s, settings.decode_memory_mb)
        )
        limits = DecodeLimits(max_frames=settings.max_video_frames, max_frame_pixels=settings.max_frame_pixels)
        self.reclaimer = Reclaimer() if settings.reclaim_memory else None
        self.decoded = DecodedBudget(
            settings.effective_max_decoded_mb(), self.reclaimer.released if self.reclaimer else None
        )
        self.preparer = Preparer(self.pool, profile.frame_spec, settings.video_roots, limits, self.decoded)

    @property
    def backend(self) -> str:
        return self.profile.name

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the engine; on failure the status says `failed` and the failure hook runs."""
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.pool.start)
            # the checkpoint's sampling defaults, one rule for every engine: a bad value refuses
            # the start before the model loads, not every chat request once served
            check_checkpoint(self.engine.config.model_path)
            await self.engine.start()
            self._check_answer_words()
            self.engine.sampling_defaults()  # what the engine applies (vLLM's overrides too), checked
        except Exception as exc:
            logger.exception("engine %s could not load %s", self.engine.name, self.engine.model_name)
            self.fail(f"engine could not start: {type(exc).__name__}: {exc}")
            return
        if self.settings.effective_warmup():
            s = self.settings
            try:
                self.warmup = await warm_up(self.engine, self.profile, s.warmup_batch, s.warmup_frames, s.warmup_size)
            except Exception as exc:
                logger.exception("engine %s could not score the warm-up batch", self.engine.name)
                self.fail(f"engine could not score the warm-up batch: {type(exc).__name__}: {exc}")
                return
            self.engine.stats.reset()  # the counters describe real requests only
        if self.freeze_heap:
            # the engine's heap, from now on never scanned: the reclaimer's collections (on the
            # event loop) and Python's own take milliseconds, not 0.4 s (memory_release.py)
            self.heap_frozen = await asyncio.to_thread(freeze_startup_heap)
            logger.info("start-up heap frozen: %d objects the collector will not scan again", self.heap_frozen)
        if self.settings.freeze_heap:
            # the engine's own processes (vLLM's engine core) are the service's alone even when the
            # service is embedded: their heaps, warm-up included, are frozen too (engines/vllm/heap.py)
            try:
                await self.engine.freeze_heap()
            except Exception:  # an optimization: the server serves as well without it
                logger.exception("the engine's heap could not be frozen; serving without it")
        self.status = "ok"
        logger.info(
            "ready: backend=%s engine=%s model=%s (%.1f s)",
            self.backend,
            self.engine.name,
            self.engine.model_name,
            time.perf_counter() - started,
        )

    def _check_answer_words(self) -> None:
        for mode in PROBABILITY_MODES:
            if mode not in self.profile.score_modes:
                continue
            try:
                self.engine.check_answer_words(self.profile.answer_words(mode), mode)
            except AnswerWordsUnsupported as exc:
                if self.profile.default_score_mode == mode:
                    raise  # the server would refuse its own default: do not start
                logger.warning("score_mode %s is unavailable: %s", mode, exc)
                self.profile.disable_score_mode(mode, str(exc))

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
        try:
            await self.engine.shutdown()
        finally:
            self.pool.shutdown()

    # --- admission ----------------------------------------------------------------------------

    def require_ready(self) -> None:
        if self.status != "ok":
            raise NotReady(
                self.status, f"the reward server is {self.status}" + (f": {self.detail}" if self.detail else "")
            )

    def admit_body(self, declared: int | None) -> None:
        """Called before a body is read: refuse now if the server is not serving, or the body
        alone could never fit; its bytes are admitted as they arrive (http/body.py)."""
        self.require_ready()
        if declared is not None:
            self.admission.check_declared(declared)
        self.active += 1

    def release_body(self) -> None:
        self.active -= 1

    async def run(
        self, kind: WorkKind, jobs: Sequence[Callable[[], Awaitable[T]]], deadline: Deadline
    ) -> list[T | BaseException]:
        """The one way work reaches the engine, for every route. The jobs are admitted together
        (--max-queue, 503 when full); each runs as its own task under the request's `deadline`
        (--request-timeout-s, or the client's shorter one), so a job that fails or runs out of time
        is answered in its place while the others finish; if the caller is cancelled (client gone, drain) every job is,
        which aborts its engine work. Returns each job's result or exception, in order."""
        self.admission.take(kind, len(jobs))
        try:
            tasks = [asyncio.ensure_future(self._within_deadline(job, deadline)) for job in jobs]
            try:
                return await asyncio.gather(*tasks, return_exceptions=True)
            except asyncio.CancelledError:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        finally:
            self.admission.give(kind, len(jobs))

    async def _within_deadline(self, job: Callable[[], Awaitable[T]], deadline: Deadline) -> T:
        limit = asyncio.timeout_at(asyncio.get_running_loop().time() + deadline.remaining())
        try:
            async with limit:
                return await job()
        except TimeoutError:
            if limit.expired():
                raise DeadlineExceeded(f"the answer took longer than {deadline.seconds:g} s ({deadline.why})") from None
            raise

    def deadline(self, header: str | None, started: float) -> Deadline:
        """The deadline of a request whose handling began at `started`: the client's
        X-Reward-Deadline-S (seconds it still waits), capped by --request-timeout-s."""
        return Deadline.of_request(header, self.settings.request_timeout_s, started)
