"""Scoring episodes (`POST /score`, `POST /score/batch` as JSON or a raw batch) over the core.

Scoring: body -> episodes -> frames -> profile -> engine -> parser -> answer. Each episode goes
to the engine on its own as soon as its frames are ready: the episodes of a batch overlap their
preparation with each other's engine work, and an episode whose deadline passes, or whose
client leaves, is cancelled, which aborts it inside the engine. Admission, the deadline and
cancellation are the core's (`RewardService.run`), one unit of --max-queue per episode.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from reward_protocol import raw_batch
from reward_protocol.progress import check_points
from reward_protocol.score import (
    FAILED_PARSE_STATUSES,
    BatchItem,
    BatchScoreResponse,
    ScoreOptions,
    ScoreResponse,
    Timings,
)
from reward_server.api.request_body import RequestBody
from reward_server.core.deadline import Deadline
from reward_server.core.service import RewardService
from reward_server.engines.base import EngineDead
from reward_server.errors import BadRequest, NotReady, classify
from reward_server.media.decoding import (
    InvalidBody,
    Source,
    View,
    parse_batch_json,
    parse_score_json,
    validation_message,
)
from reward_server.profiles import canonical_backend


@dataclass
class Frames:
    """An episode's model-ready frames, and when its bytes had all arrived (perf_counter)."""

    video: np.ndarray  # several camera views: the first view's
    received: float
    views: list[View] | None = None  # several named camera views, in the order the model sees them

    @classmethod
    def of(cls, ready: np.ndarray | list[View], received: float) -> Frames:
        if isinstance(ready, list):
            return cls(ready[0][1], received, ready)
        return cls(ready, received)


def _total(values) -> int | None:
    """The sum of the values an engine reported; None if it reported none."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _timed(
    frames: Callable[[], Awaitable[np.ndarray | list[View]]], received: float
) -> Callable[[], Awaitable[Frames]]:
    async def run() -> Frames:
        return Frames.of(await frames(), received)

    return run


class EpisodeScoring:
    """/score and /score/batch: a body becomes episodes, each episode one engine request (or one
    per curve point) through the core, its answer parsed by the profile."""

    def __init__(self, service: RewardService):
        self.service = service
        self.preparer = service.preparer

    # --- routes -------------------------------------------------------------------------------

    async def score_json(self, reader: RequestBody, deadline: Deadline) -> ScoreResponse:
        body = await reader.read_all()
        received = time.perf_counter()
        source = await self.preparer.parse(parse_score_json, body)
        if isinstance(source, Exception):
            raise source
        frames = _timed(lambda: self.preparer.frames(source), received)
        job = partial(self._score, source.options, frames, deadline)
        [result] = await self.service.run("episodes", [job], deadline)
        if isinstance(result, BaseException):
            raise result
        return result

    async def score_batch_json(self, reader: RequestBody, deadline: Deadline) -> BatchScoreResponse:
        body = await reader.read_all()
        received = time.perf_counter()
        sources = await self.preparer.parse(parse_batch_json, body)
        work = [
            (s.options, _timed(partial(self.preparer.frames, s), received)) if isinstance(s, Source) else s
            for s in sources
        ]
        return await self._score_many(work, deadline)

    async def score_batch_raw(self, reader: RequestBody, deadline: Deadline) -> BatchScoreResponse:
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
            refs = item.frame_refs()
            body = await reader.wait_for(header_end + max(ref.offset + ref.nbytes for ref in refs))
            received = time.perf_counter()
            payload = body[header_end:]
            if item.views is None:
                arr = raw_batch.frames_view(refs[0], payload)
                return Frames(await self.preparer.raw(arr, item.nframes, item.max_pixels), received)
            views = [(view.name, raw_batch.frames_view(view.frames, payload)) for view in item.views]
            return Frames.of(await self.preparer.views(views, item.nframes, item.max_pixels), received)

        work = []
        for item in header.requests:
            options = ScoreOptions.model_construct(**{k: getattr(item, k) for k in ScoreOptions.model_fields})
            if item.video_path is None:
                work.append((options, partial(frames_of, item)))
            else:
                source = Source(options, "path", item.video_path or "")
                work.append((options, _timed(partial(self.preparer.frames, source), time.perf_counter())))
        return await self._score_many(work, deadline)

    # --- the flow of one episode --------------------------------------------------------------

    async def _score_many(self, work: list, deadline: Deadline) -> BatchScoreResponse:
        """Score (options, frames awaitable) pairs together; a failed item is answered in its place."""
        live = [w for w in work if not isinstance(w, Exception)]
        jobs = [partial(self._score, options, frames, deadline) for options, frames in live]
        results = await self.service.run("episodes", jobs, deadline)
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
        self, options: ScoreOptions, frames: Callable[[], Awaitable[Frames]], deadline: Deadline
    ) -> ScoreResponse:
        started = deadline.started
        service = self.service
        profile, engine, metrics, backend = service.profile, service.engine, service.metrics, service.backend
        ready = await frames()
        video = ready.video
        if options.backend is not None and canonical_backend(options.backend) != backend:
            raise BadRequest(
                f"this server runs backend {backend!r}; request asked for {options.backend!r}. "
                f"Omit 'backend' or start a server with --backend {options.backend}"
            )
        kwargs = options.backend_kwargs
        score_mode = profile.resolve_score_mode(kwargs)
        points = options.progress_points
        if points > 1:  # a bad K is a 422 (errors.py) naming the range
            check_points(points, len(video), service.settings.max_progress_points)
        prepared = time.perf_counter()
        if points > 1:
            requests = profile.build_curve(options.task_text, video, kwargs, score_mode, points)
        elif ready.views is not None:
            requests = [profile.build_views(options.task_text, ready.views, kwargs, score_mode)]
        else:
            requests = [profile.build(options.task_text, video, kwargs, score_mode)]
        for k, request in enumerate(requests):  # clients may reuse their own ids; the engine may not
            request.request_id = f"{uuid.uuid4().hex}-p{k}" if points > 1 else uuid.uuid4().hex
        queued = time.perf_counter()
        if points > 1:
            outputs = await engine.generate_curve(requests)
        else:
            outputs = [await engine.generate(requests[0])]
        parsed = [profile.parse(output, score_mode, kwargs) for output in outputs]
        last, output = parsed[-1], outputs[-1]
        total = time.perf_counter() - started
        metrics.episodes.labels(last.status.value).inc()
        if points > 1:
            metrics.curve_points.inc(points)
        for point in parsed:  # a curve's points that could not be parsed count as parse failures
            if point.status in FAILED_PARSE_STATUSES:
                metrics.parse_failures.labels(point.status.value).inc()
        metrics.latency.observe(total)
        metrics.engine_latency.observe(output.engine_ms / 1000)
        engine_wall = (time.perf_counter() - queued) * 1000
        return ScoreResponse(
            score=last.score,
            model_output=output.text,
            backend=backend,
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
