"""The one intake of every body-carrying route: content type and size checked before a byte is
read, the body admitted as it arrives (http/body.py), the request's deadline made once (from the
client's X-Reward-Deadline-S and --request-timeout-s) and handed to the dialect's work, which is
cancelled when the client leaves."""

from __future__ import annotations

import time

from fastapi import Request

from reward_protocol import raw_batch
from reward_protocol.score import DEADLINE_HEADER
from reward_server.api.request_body import Work
from reward_server.core.service import RewardService
from reward_server.errors import BadRequest, UnsupportedMediaType
from reward_server.http.body import BodyLimits, BodyReader, cancel_on_disconnect
from reward_server.http.limits import body_limit
from reward_server.request_errors import BodyTooLarge, LengthRequired


class BodyIntake:
    def __init__(self, service: RewardService):
        self.service = service

    async def __call__(self, request: Request, allowed: tuple[str, ...], work: Work) -> object:
        service, settings = self.service, self.service.settings
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
        deadline = service.deadline(request.headers.get(DEADLINE_HEADER), started)
        limits = BodyLimits(
            max_bytes=limit.bytes,
            idle_timeout_s=settings.body_timeout_s,
            min_rate=settings.body_min_rate_kib_s * 1024,
            total_s=deadline.seconds,
            clients_deadline=deadline.seconds < settings.request_timeout_s,
        )
        reader = BodyReader(request.receive, length, limits, service.admission)
        service.admit_body(length)
        try:
            reader.start()
            answer = await cancel_on_disconnect(work(reader, deadline, ctype), reader)
            # A raw batch is scored from the bytes its header names, which may end before the
            # declared length: still answer only a body that arrived whole. One shorter than its
            # Content-Length is a broken upload, not partial data to score: 408 once it stalls
            # for --body-timeout-s (a client that closes instead just loses its connection).
            await reader.read_all()
            return answer
        finally:
            await reader.close()
            service.release_body()
