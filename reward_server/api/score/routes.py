"""The scoring dialect's routes: each hands its body to the intake and its work to EpisodeScoring."""

from __future__ import annotations

from fastapi import APIRouter, Request

from reward_protocol import raw_batch
from reward_protocol.score import BatchScoreRequest, BatchScoreResponse, ScoreRequest, ScoreResponse
from reward_server.api.openapi import ERRORS, JSON, body_schema
from reward_server.api.request_body import Intake, RequestBody
from reward_server.api.score.scoring import EpisodeScoring
from reward_server.core.deadline import Deadline
from reward_server.core.service import RewardService


def router(service: RewardService, intake: Intake) -> APIRouter:
    routes = APIRouter()
    scoring = EpisodeScoring(service)

    @routes.post("/score", response_model=ScoreResponse, responses=ERRORS, openapi_extra=body_schema(ScoreRequest))
    async def score(request: Request) -> ScoreResponse:
        """Judge one finished episode."""
        return await intake(request, (JSON,), lambda reader, deadline, _: scoring.score_json(reader, deadline))

    @routes.post(
        "/score/batch",
        response_model=BatchScoreResponse,
        responses=ERRORS,
        openapi_extra=body_schema(BatchScoreRequest, raw=True),
    )
    async def score_batch(request: Request) -> BatchScoreResponse:
        """Judge many episodes together (JSON, or a raw batch of frames); a bad item is answered with
        its error, the others are scored."""

        async def work(reader: RequestBody, deadline: Deadline, ctype: str) -> BatchScoreResponse:
            if ctype == raw_batch.CONTENT_TYPE:
                return await scoring.score_batch_raw(reader, deadline)
            return await scoring.score_batch_json(reader, deadline)

        return await intake(request, (JSON, raw_batch.CONTENT_TYPE), work)

    return routes
