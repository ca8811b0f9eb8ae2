"""The server's one service behind every route: lifecycle, admission, deadlines, the engine.

It owns the server's lifecycle state (loading / ok / draining / failed) and the one path by which
work reaches the engine (`_admitted`): admission (--max-queue), the request's deadline
(--request-timeout-s, or the client's shorter X-Reward-Deadline-S; a 504 naming it),
cancellation when the client leaves. Every route goes through it: /score, /score/batch (JSON
and raw) and OpenAI's chat route (api/chat.py, a thin layer that only translates the protocol).
The HTTP layer only reads bodies and translates errors.

Scoring: body -> episodes -> frames -> profile -> engine -> parser -> answer. Each episode goes
to the engine on its own as soon as its frames are ready: the episodes of a batch overlap their
preparation with each other's engine work, and an episode whose deadline passes, or whose
client leaves, is cancelled, which aborts it inside the engine.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np

from reward_client import raw_batch
from reward_client.progress import check_points
from reward_client.protocol import (
    DEADLINE_HEADER,
    FAILED_PARSE_STATUSES,
    BatchItem,
    BatchScoreResponse,
    HealthStatus,
    ScoreOptions,
    ScoreResponse,
    Timings,
)
from reward_server.core.admission import Admission, WorkKind
from reward_server.core.metrics import Metrics
from reward_server.core.warmup import WarmupReport, warm_up
from reward_server.engines.base import AnswerWordsUnsupported, Engine, EngineDead
from reward_server.engines.io import EngineOutput, EngineRequest
from reward_server.errors import BadRequest, DeadlineExceeded, NotReady, classify
from reward_server.http.body import BodyReader
from reward_server.media.decode_pool import DecodePool, PoolBudget
from reward_server.media.decoded_budget import DecodedBudget
from reward_server.media.decoding import (
    ChatMedia,
    InvalidBody,
    Preparer,
    Source,
    parse_batch_json,
    parse_score_json,
    validation_message,
)
from reward_server.media.images import MediaRef
from reward_server.media.memory_release import Reclaimer
from reward_server.media.video import DecodeLimits
from reward_server.profiles import Profile, canonical_backend
from reward_server.settings import ServerSettings

logger = logging.getLogger(__name__)

# The client's deadline for the request being handled (DEADLINE_HEADER), set by the HTTP layer.
_CLIENT_DEADLINE_S: contextvars.ContextVar[float | None] = contextvars.ContextVar("client_deadline_s", default=None)

SMALL_BODY_BYTES = 1 << 20
T = TypeVar("T")


@dataclass
class Frames:
    """An episode's model-ready frames, and when its bytes had all arrived (perf_counter)."""

    video: np.ndarray
    received: float


def _total(values) -> int | None:
    """The sum of the values an engine reported; None if it reported none."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _timed(frames: Callable[[], Awaitable[np.ndarray]], received: float) -> Callable[[], Awaitable[Frames]]:
    async def run() -> Frames:
        return Frames(await frames(), received)

    return run


class RewardService:
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
            await self.engine.start()
            self._check_answer_words()
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
        self.status = "ok"
        logger.info(
            "ready: backend=%s engine=%s model=%s (%.1f s)",
            self.backend,
            self.engine.name,
            self.engine.model_name,
            time.perf_counter() - started,
        )

    def _check_answer_words(self) -> None:
        if "logprob" not in self.profile.score_modes:
            return
        try:
            self.engine.check_answer_words(self.profile.logprob_words)
        except AnswerWordsUnsupported as exc:
            if self.profile.default_score_mode == "logprob":
                raise  # the server would refuse its own default: do not start
            logger.warning("score_mode logprob is unavailable: %s", exc)
            self.profile.disable_score_mode("logprob", str(exc))

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

    async def _admitted(
        self, kind: WorkKind, jobs: Sequence[Callable[[], Awaitable[T]]], started: float
    ) -> list[T | BaseException]:
        """The one way work reaches the engine, for every route. The jobs are admitted together
        (--max-queue, 503 when full); each runs as its own task under the request's deadline
        (--request-timeout-s), so a job that fails or runs out of time is answered in its place
        while the others finish; if the caller is cancelled (client gone, drain) every job is,
        which aborts its engine work. Returns each job's result or exception, in order."""
        self.admission.take(kind, len(jobs))
        try:
            tasks = [asyncio.ensure_future(self._within_deadline(job, started)) for job in jobs]
            try:
                return await asyncio.gather(*tasks, return_exceptions=True)
            except asyncio.CancelledError:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
        finally:
            self.admission.give(kind, len(jobs))

    async def _within_deadline(self, job: Callable[[], Awaitable[T]], started: float) -> T:
        limit = asyncio.timeout_at(asyncio.get_running_loop().time() + self._remaining(started))
        try:
            async with limit:
                return await job()
        except TimeoutError:
            if limit.expired():
                limit_s, why = self._timeout_s()
                raise DeadlineExceeded(f"the answer took longer than {limit_s:g} s ({why})") from None
            raise

    async def _one(self, kind: WorkKind, job: Callable[[], Awaitable[T]], started: float) -> T:
        [result] = await self._admitted(kind, [job], started)
        if isinstance(result, BaseException):
            raise result
        return result

    # --- routes -------------------------------------------------------------------------------

    async def score_json(self, reader: BodyReader, started: float) -> ScoreResponse:
        body = await reader.read_all()
        received = time.perf_counter()
        source = await self.parse_body(parse_score_json, body)
        if isinstance(source, Exception):
            raise source
        frames = _timed(lambda: self.preparer.frames(source), received)
        return await self._one("episodes", partial(self._score, source.options, frames, started), started)

    async def score_batch_json(self, reader: BodyReader, started: float) -> BatchScoreResponse:
        body = await reader.read_all()
        received = time.perf_counter()
        sources = await self.parse_body(parse_batch_json, body)
        work = [
            (s.options, _timed(partial(self.preparer.frames, s), received)) if isinstance(s, Source) else s
            for s in sources
        ]
        return await self._score_many(work, started)

    async def score_batch_raw(self, reader: BodyReader, started: float) -> BatchScoreResponse:
        """Episodes start as soon as their own bytes have arrived, while the rest still streams in."""
        assert reader.length is not None
        try:
            header_end = raw_batch.header_end(await reader.wait_for(min(raw_batch.PREFIX_BYTES, reader.length)))
        except raw_batch.RawBatchError as exc:
            raise InvalidBody(str(exc)) from None
        head = await reader.wait_for(min(header_end, reader.length))
        try:
            header = await asyncio.to_thread(raw_batch.decode_header, head, reader.length)
        except raw_batch.RawBatchError as exc:
            detail = f": {validation_message(exc.errors)}" if exc.errors else ""
            raise InvalidBody(f"{exc}{detail}") from None

        async def frames_of(item: raw_batch.RawScoreItem) -> Frames:
            assert item.frames is not None
            end = header_end + item.frames.offset + item.frames.nbytes
            view = await reader.wait_for(end)
            received = time.perf_counter()
            arr = raw_batch.frames_view(item.frames, view[header_end:])
            return Frames(await self.preparer.raw(arr, item.nframes, item.max_pixels), received)

        work = []
        for item in header.requests:
            options = ScoreOptions.model_construct(**{k: getattr(item, k) for k in ScoreOptions.model_fields})
            if item.frames is not None:
                work.append((options, partial(frames_of, item)))
            else:
                source = Source(options, "path", item.video_path or "")
                work.append((options, _timed(partial(self.preparer.frames, source), time.perf_counter())))
        return await self._score_many(work, started)

    # --- the flow of one episode --------------------------------------------------------------

    async def parse_body(self, fn, body: memoryview):
        """A JSON document is parsed in one piece: small ones in a thread (microseconds of GIL),
        large ones in a decode worker, where seconds of parsing cannot stall the engine."""
        if len(body) <= SMALL_BODY_BYTES:
            return await asyncio.to_thread(fn, bytes(body))
        return await self.pool.run(fn, bytes(body), task="body")

    async def decode_media(self, media: list[MediaRef]) -> ChatMedia:
        """A chat request's images and videos, model-ready (in a decode worker, within its budgets),
        and their share of the decoded-memory budget, which the caller gives back."""
        return await self.preparer.media(media)

    async def chat(
        self, choices: Sequence[Callable[[], Awaitable[EngineRequest]]], started: float
    ) -> list[EngineOutput]:
        """A chat request's choices (n of them) on the path every route takes (admission, deadline,
        cancellation): each builds its engine request (decoding the media) and is one unit of
        --max-queue, counted as chat, not as episodes. The first failure is the answer."""

        def run(build: Callable[[], Awaitable[EngineRequest]]) -> Callable[[], Awaitable[EngineOutput]]:
            async def one() -> EngineOutput:
                request = await build()
                request.request_id = uuid.uuid4().hex
                return await self.engine.generate(request)

            return one

        results = await self._admitted("chat", [run(b) for b in choices], started)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        outputs: list[EngineOutput] = results  # type: ignore[assignment]
        for output in outputs:
            self.metrics.chat_requests.labels(output.finish_reason or "stop").inc()
        self.metrics.chat_latency.observe(time.perf_counter() - started)
        return outputs

    async def _score_many(self, work: list, started: float) -> BatchScoreResponse:
        """Score (options, frames awaitable) pairs together; a failed item is answered in its place."""
        live = [w for w in work if not isinstance(w, Exception)]
        jobs = [partial(self._score, options, frames, started) for options, frames in live]
        results = await self._admitted("episodes", jobs, started)
        answers = iter(results)
        out = []
        for index, item in enumerate(work):
            result = item if isinstance(item, Exception) else next(answers)
            if isinstance(result, ScoreResponse):
                out.append(BatchItem(index=index, response=result))
                continue
            if isinstance(result, (NotReady, EngineDead)):
                raise result
            _, error = classify(result)
            out.append(BatchItem(index=index, error=error))
        return BatchScoreResponse(results=out)

    async def _score(
        self, options: ScoreOptions, frames: Callable[[], Awaitable[Frames]], started: float
    ) -> ScoreResponse:
        ready = await frames()
        video = ready.video
        if options.backend is not None and canonical_backend(options.backend) != self.backend:
            raise BadRequest(
                f"this server runs backend {self.backend!r}; request asked for {options.backend!r}. "
                f"Omit 'backend' or start a server with --backend {options.backend}"
            )
        kwargs = options.backend_kwargs
        score_mode = self.profile.resolve_score_mode(kwargs)
        points = options.progress_points
        if points > 1:  # a bad K is a 422 (errors.py) naming the range
            check_points(points, len(video), self.settings.max_progress_points)
        prepared = time.perf_counter()
        if points > 1:
            requests = self.profile.build_curve(options.task_text, video, kwargs, score_mode, points)
        else:
            requests = [self.profile.build(options.task_text, video, kwargs, score_mode)]
        for k, request in enumerate(requests):  # clients may reuse their own ids; the engine may not
            request.request_id = f"{uuid.uuid4().hex}-p{k}" if points > 1 else uuid.uuid4().hex
        queued = time.perf_counter()
        if points > 1:
            outputs = await self.engine.generate_curve(requests)
        else:
            outputs = [await self.engine.generate(requests[0])]
        parsed = [self.profile.parse(output, score_mode) for output in outputs]
        last, output = parsed[-1], outputs[-1]
        total = time.perf_counter() - started
        self.metrics.episodes.labels(last.status.value).inc()
        if points > 1:
            self.metrics.curve_points.inc(points)
        for point in parsed:  # a curve's points that could not be parsed count as parse failures
            if point.status in FAILED_PARSE_STATUSES:
                self.metrics.parse_failures.labels(point.status.value).inc()
        self.metrics.latency.observe(total)
        self.metrics.engine_latency.observe(output.engine_ms / 1000)
        engine_wall = (time.perf_counter() - queued) * 1000
        return ScoreResponse(
            score=last.score,
            model_output=output.text,
            backend=self.backend,
            parse_status=last.status,
            parse_error=last.error,
            raw_value=last.raw_value,
            score_mode=score_mode,
            nframes=len(video),
            prompt_tokens=_total(o.prompt_tokens for o in outputs),
            output_tokens=_total(o.output_tokens for o in outputs),
            timings=Timings(
                receive_ms=(ready.received - started) * 1000,
                prepare_ms=(prepared - ready.received) * 1000,
                preprocess_ms=(prepared - started) * 1000,
                queue_ms=min(o.queue_ms for o in outputs),
                input_ms=max(o.input_ms for o in outputs),
                prefill_ms=max(o.prefill_ms for o in outputs),
                decode_ms=max(o.decode_ms for o in outputs),
                engine_ms=engine_wall,
                total_ms=total * 1000,
            ),
            request_id=options.request_id,
            prompt=output.prompt if kwargs.return_prompt else None,
            progress=[p.score for p in parsed] if points > 1 else None,
            cached_tokens=_total(o.cached_tokens for o in outputs),
        )

    def client_deadline(self, header: str | None) -> float:
        """The deadline of the request being handled: the client's X-Reward-Deadline-S (seconds it
        still waits), capped by --request-timeout-s. Set for the request's task; the tasks it
        starts inherit it."""
        if header is None:
            _CLIENT_DEADLINE_S.set(None)
            return self.settings.request_timeout_s
        try:
            seconds = float(header)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise BadRequest(f"{DEADLINE_HEADER} must be a positive number of seconds, got {header[:40]!r}")
        _CLIENT_DEADLINE_S.set(seconds)
        return min(seconds, self.settings.request_timeout_s)

    def _timeout_s(self) -> tuple[float, str]:
        """This request's deadline in seconds, and what set it."""
        client = _CLIENT_DEADLINE_S.get()
        if client is not None and client < self.settings.request_timeout_s:
            return client, f"the client's {DEADLINE_HEADER}"
        return self.settings.request_timeout_s, "--request-timeout-s"

    def _remaining(self, started: float) -> float:
        return max(0.0, self._timeout_s()[0] - (time.perf_counter() - started))
