"""The OpenAI chat dialect's routes, answering as `vllm serve` does, errors in OpenAI's shape."""

from __future__ import annotations

from fastapi import APIRouter, Request

from reward_protocol.chat import ChatCompletionRequest, ChatCompletionResponse, ModelList
from reward_server.api.chat.completions import ChatCompletions
from reward_server.api.openapi import JSON, OPENAI_ERRORS, body_schema
from reward_server.api.request_body import Intake
from reward_server.core.service import RewardService


def router(service: RewardService, intake: Intake) -> APIRouter:
    routes = APIRouter()
    chat = ChatCompletions(service)

    @routes.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses=OPENAI_ERRORS,
        openapi_extra=body_schema(ChatCompletionRequest),
    )
    async def chat_completions(request: Request) -> ChatCompletionResponse:
        """OpenAI's chat completions (no streaming), on the same engine, admission and decode
        workers as /score: text, image_url and video_url parts; errors in OpenAI's shape."""
        return await intake(request, (JSON,), lambda reader, deadline, _: chat.complete(reader, deadline))

    @routes.get("/v1/models", response_model=ModelList, responses={k: OPENAI_ERRORS[k] for k in (401, 503)})
    async def models() -> ModelList:
        """The served model (--served-model-name); 503 until the engine serves."""
        return chat.models()

    return routes
