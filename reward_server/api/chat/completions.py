"""OpenAI's chat dialect (`POST /v1/chat/completions`, `GET /v1/models`) over the scoring service.

A thin layer: the body is read, admitted and parsed as /score bodies are, the request's images
and video are decoded in the same decode workers within the same budgets, and the engine request
goes through the core's one admission and deadline entry (`RewardService.run`) to the same
engine, where it is batched with scoring requests. What differs is only the protocol: the
prompt is the client's own chat (no scoring profile's prompt or parser), and the answer is the
model's text in OpenAI's shape. Streaming is not built: `stream: true` is refused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from reward_protocol.chat import (
    MAX_TOP_LOGPROBS,
    UNSUPPORTED_FIELDS,
    ChatChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChoiceLogprobs,
    ImageContent,
    ModelCard,
    ModelList,
    TextContent,
    TokenLogprob,
    TopLogprob,
    Usage,
    is_neutral,
)
from reward_server.api.request_body import RequestBody
from reward_server.core.deadline import Deadline
from reward_server.core.service import RewardService
from reward_server.engines.io import (
    ChatPrompt,
    EngineOutput,
    EngineRequest,
    ImagePart,
    Part,
    Sampling,
    TextPart,
    Turn,
    VideoPart,
)
from reward_server.errors import BadRequest, NotFound, TooManyImages
from reward_server.media.decoded_budget import DecodedTooLarge
from reward_server.media.decoding import ChatMedia, InvalidBody, parse_chat_json
from reward_server.media.images import MediaRef
from reward_server.profiles import UnsupportedOption

logger = logging.getLogger(__name__)

# OpenAI's neutral values, for a field the request, the server's flags and the checkpoint's
# generation config all leave unset (vLLM's chat defaults)
NEUTRAL = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
# apply_chat_template's own arguments: not template variables, so not settable through chat_template_kwargs
_TEMPLATE_ARGUMENTS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
MIN_LOGPROB = -9999.0  # JSON has no -inf; OpenAI-compatible servers report this floor instead


@dataclass
class _Prompt:
    """A chat request's messages as the engine wants them, and the media still to decode."""

    turns: list[Turn] = field(default_factory=list)
    media: list[MediaRef] = field(default_factory=list)
    images: int = 0
    videos: int = 0
    template_kwargs: tuple = ()


class ChatCompletions:
    def __init__(self, service: RewardService):
        self.service = service
        settings = service.settings
        self.model_name = settings.effective_served_model_name()
        self.answers_to = {self.model_name, *([settings.model_path] if settings.model_path else [])}
        self.created = int(time.time())
        self._defaults: dict[str, Any] | None = None

    def defaults(self) -> dict[str, Any]:
        """Sampling values for fields a request leaves unset (the engine is started: requests are
        admitted only then): the server's --temperature / --top-p (the operator's override, as
        vLLM's --override-generation-config), else the checkpoint's generation config."""
        if self._defaults is None:
            settings = self.service.settings
            defaults = dict(self.service.engine.sampling_defaults())
            if settings.temperature is not None:
                defaults["temperature"] = settings.temperature
            if settings.top_p is not None:
                defaults["top_p"] = settings.top_p
            if defaults:
                logger.info("chat requests that leave these unset get: %s", defaults)
            self._defaults = defaults
        return self._defaults

    # --- routes -------------------------------------------------------------------------------

    def models(self) -> ModelList:
        self.service.require_ready()  # a client waiting for /v1/models waits for the engine
        return ModelList(data=[ModelCard(id=self.model_name, created=self.created)])

    async def complete(self, reader: RequestBody, deadline: Deadline) -> ChatCompletionResponse:
        body = await reader.read_all()
        try:
            req: ChatCompletionRequest = await self.service.preparer.parse(parse_chat_json, body)
        except InvalidBody as exc:  # OpenAI's and vLLM's status for a field that fails validation
            raise BadRequest(str(exc), exc.param) from None
        sampling = self.sampling(req)
        prompt = self.prompt(req)
        n = req.n or 1
        media: asyncio.Future | None = None

        async def build(choice: int) -> EngineRequest:
            nonlocal media
            if media is None:  # decoded once for every choice
                media = asyncio.ensure_future(self.service.preparer.media(prompt.media))
            try:
                decoded: ChatMedia = await asyncio.shield(media)
            except DecodedTooLarge as exc:
                raise exc.at("messages") from None
            # vLLM's rule for n > 1: choice i samples with seed + i
            seed = sampling.seed + choice if sampling.seed is not None else None
            return self._engine_request(prompt, decoded.arrays, replace(sampling, seed=seed))

        try:
            outputs = await self._generate([_bind(build, i) for i in range(n)], deadline)
        finally:
            if media is not None:
                _give_back(media)
        return self.response(outputs)

    async def _generate(
        self, choices: Sequence[Callable[[], Awaitable[EngineRequest]]], deadline: Deadline
    ) -> list[EngineOutput]:
        """A chat request's choices (n of them) through the core's one entry (admission, deadline,
        cancellation): each builds its engine request (decoding the media) and is one unit of
        --max-queue, counted as chat, not as episodes. The first failure is the answer."""
        engine, metrics = self.service.engine, self.service.metrics

        def run(build: Callable[[], Awaitable[EngineRequest]]) -> Callable[[], Awaitable[EngineOutput]]:
            async def one() -> EngineOutput:
                request = await build()
                request.request_id = uuid.uuid4().hex
                return await engine.generate(request)

            return one

        results = await self.service.run("chat", [run(b) for b in choices], deadline)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        outputs: list[EngineOutput] = results  # type: ignore[assignment]
        for output in outputs:
            metrics.chat_requests.labels(output.finish_reason or "stop").inc()
        metrics.chat_latency.observe(time.perf_counter() - deadline.started)
        return outputs

    # --- request -> engine request ------------------------------------------------------------

    def _check_protocol(self, req: ChatCompletionRequest) -> None:
        if req.stream:
            raise BadRequest(
                "streaming (stream: true) is not built in this server; send stream: false or omit it", "stream"
            )
        if req.model is not None and req.model not in self.answers_to:
            raise NotFound(f"model {req.model!r} is not served here; this server serves {self.model_name!r}", "model")
        fmt = (req.response_format or {}).get("type", "text")
        if fmt != "text":
            raise BadRequest(f"response_format {fmt!r} is not supported; only 'text'", "response_format")
        if (req.model_extra or {}).get("tools") == []:  # vLLM's rule (and OpenAI's)
            raise BadRequest("tools must not be an empty array; leave it out", "tools")
        if req.stream_options:  # vLLM's rule: any options but empty ones
            raise BadRequest("stream_options can only be set with stream: true", "stream_options")
        for name, (what, _) in UNSUPPORTED_FIELDS.items():
            value = (req.model_extra or {}).get(name)
            if not is_neutral(name, value):
                raise BadRequest(f"{name}: {what} is not supported by this server", name)
        for key in req.chat_template_kwargs or {}:
            if key in _TEMPLATE_ARGUMENTS:
                raise BadRequest(
                    f"chat_template_kwargs.{key}: {key!r} is an argument of the template call, not a template "
                    "variable; this server renders with the model's own template and add_generation_prompt",
                    "chat_template_kwargs",
                )

    def sampling(self, req: ChatCompletionRequest) -> Sampling:
        self._check_protocol(req)
        settings = self.service.settings
        engine = self.service.engine
        max_tokens = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        # unset: the context left after the prompt (vLLM's default), at most --max-tokens-limit (the
        # server's cap, as vLLM's own override cap); the scoring profile's default is not chat's
        if max_tokens is not None and max_tokens > settings.max_tokens_limit:
            raise UnsupportedOption(
                f"{param} {max_tokens} exceeds this server's limit of {settings.max_tokens_limit} (--max-tokens-limit)",
                param,
            )
        # vLLM's rules: top_logprobs 0 means none and needs nothing; any other value needs logprobs;
        # -1 (the whole vocabulary) is beyond vllm serve's default --max-logprobs 20, as here
        if req.top_logprobs and not req.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        if req.top_logprobs == -1:
            vocab_size = engine.vocab_size()
            raise BadRequest(
                f"top_logprobs -1 asks for every token of the vocabulary ({vocab_size or 'all'}); this server "
                f"returns at most {MAX_TOP_LOGPROBS} alternatives per token (as vllm serve at its default "
                "--max-logprobs)",
                "top_logprobs",
            )
        if max_tokens is not None and req.min_tokens > max_tokens:
            raise BadRequest(f"min_tokens {req.min_tokens} is more than {param} {max_tokens}", "min_tokens")
        ids = tuple(req.allowed_token_ids) if req.allowed_token_ids is not None else None
        stop_ids = tuple(req.stop_token_ids or ())
        vocab = engine.vocab_size()
        for name, values in (("allowed_token_ids", ids), ("stop_token_ids", stop_ids)):
            if values and vocab is not None and max(values) >= vocab:
                raise BadRequest(f"token id {max(values)} is outside the vocabulary (0..{vocab - 1})", name)
        asked = {
            "seed": req.seed is not None,
            "stop": bool(req.stop_list()),
            "logprobs": bool(req.logprobs),
            "allowed_token_ids": ids is not None,
            "top_k": req.top_k not in (None, 0, -1),
            "min_p": bool(req.min_p),
            "repetition_penalty": req.repetition_penalty not in (None, 1.0),
            "presence_penalty": bool(req.presence_penalty),
            "frequency_penalty": bool(req.frequency_penalty),
        }
        for name, used in asked.items():
            if used and name not in engine.sampling_options:
                raise UnsupportedOption(
                    f"{name} is not supported by the {engine.name} engine; start the server with --engine vllm",
                    name,
                )
        # vLLM's order: the request's value, the server's default (generation config), OpenAI's
        defaults = self.defaults()
        value = {
            name: requested if (requested := getattr(req, name)) is not None else defaults.get(name, neutral)
            for name, neutral in NEUTRAL.items()
        }
        if max_tokens is None and "max_tokens" in defaults:  # the checkpoint's max_new_tokens
            max_tokens = min(int(defaults["max_tokens"]), settings.max_tokens_limit)
        return Sampling(
            mode="generate",
            max_tokens=max_tokens,
            max_tokens_cap=settings.max_tokens_limit,
            temperature=value["temperature"],
            top_p=value["top_p"],
            seed=req.seed,
            stop=req.stop_list(),
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            allowed_token_ids=ids,
            top_k=max(0, value["top_k"]),  # -1 and 0: off
            min_p=value["min_p"],
            repetition_penalty=value["repetition_penalty"],
            presence_penalty=value["presence_penalty"],
            frequency_penalty=value["frequency_penalty"],
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            stop_token_ids=stop_ids,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
        )

    def prompt(self, req: ChatCompletionRequest) -> _Prompt:
        """Every message becomes a turn of its own, in order, with its role as sent (several system
        or developer messages are rendered each as the chat template renders it, as vLLM does); the
        last turn must be the user's (the model answers it); every image and video is collected
        for decoding."""
        messages = req.messages
        out = _Prompt()
        if messages[-1].role != "user":
            raise BadRequest(
                f"the last message must be a user turn (got {messages[-1].role!r}); this server answers the user",
                f"messages[{len(messages) - 1}].role",
            )
        for i, message in enumerate(messages):
            parts = self._parts(message, i, out)
            if message.role in ("system", "developer") and any(not isinstance(p, TextPart) for p in parts):
                raise BadRequest(f"a {message.role} message can hold only text", f"messages[{i}].content")
            out.turns.append(Turn(message.role, tuple(parts)))
        out.template_kwargs = tuple((req.chat_template_kwargs or {}).items())
        limit = self.service.settings.max_images_per_request
        if out.images > limit:
            raise TooManyImages(
                f"{out.images} images in one request; this server takes at most {limit} (--max-images-per-request)",
                "messages",
            )
        if out.videos > 1:
            raise BadRequest(f"{out.videos} videos in one request; send at most one video_url", "messages")
        return out

    def _parts(self, message: ChatMessage, i: int, out: _Prompt) -> list[Part]:
        if isinstance(message.content, str):
            return [TextPart(message.content)]
        parts: list[Part] = []
        for j, item in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(item, TextContent):
                parts.append(TextPart(item.text))
            elif isinstance(item, ImageContent):
                parts.append(ImagePart(out.images))
                out.images += 1
                out.media.append(MediaRef("image", item.image_url.url, f"{where}.image_url.url"))
            else:
                parts.append(VideoPart())
                out.videos += 1
                out.media.append(MediaRef("video", item.video_url.url, f"{where}.video_url.url"))
        return parts

    def _engine_request(self, prompt: _Prompt, decoded: list[np.ndarray], sampling: Sampling) -> EngineRequest:
        images = [m for ref, m in zip(prompt.media, decoded, strict=True) if ref.kind == "image"]
        video = next((m for ref, m in zip(prompt.media, decoded, strict=True) if ref.kind == "video"), None)
        last = prompt.turns[-1]
        chat = ChatPrompt(
            system=None, user=last.parts, history=tuple(prompt.turns[:-1]), template_kwargs=prompt.template_kwargs
        )
        return EngineRequest(chat=chat, video=video, images=images, sampling=sampling, fps=self.service.profile.fps)

    # --- engine output -> answer --------------------------------------------------------------

    def response(self, outputs: list[EngineOutput]) -> ChatCompletionResponse:
        """n choices of one prompt; usage counts the prompt once and every choice's tokens (as vLLM)."""
        prompt_tokens = outputs[0].prompt_tokens or 0
        completion_tokens = sum(o.output_tokens or 0 for o in outputs)
        return ChatCompletionResponse(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model_name,
            choices=[
                ChatChoice(
                    index=i,
                    message=ChatCompletionMessage(content=output.text),
                    finish_reason="length" if output.finish_reason == "length" else "stop",
                    logprobs=_logprobs(output),
                )
                for i, output in enumerate(outputs)
            ],
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        )


def _give_back(media: asyncio.Future) -> None:
    """The request's decoded media leave the budget: its answer is done, or it failed or was cancelled
    (a decode still in progress is cancelled, and gives its share back itself)."""
    if not media.done():
        media.cancel()
    elif not media.cancelled() and media.exception() is None:
        media.result().release()


def _bind(build: Callable[[int], Awaitable[EngineRequest]], choice: int) -> Callable[[], Awaitable[EngineRequest]]:
    return lambda: build(choice)


def _logprobs(output: EngineOutput) -> ChoiceLogprobs | None:
    if output.token_logprobs is None:
        return None
    return ChoiceLogprobs(
        content=[
            TokenLogprob(
                token=t.token,
                logprob=_finite(t.logprob),
                bytes=list(t.token.encode()),
                top_logprobs=[
                    TopLogprob(token=tok, logprob=_finite(lp), bytes=list(tok.encode())) for tok, lp in t.top
                ],
            )
            for t in output.token_logprobs
        ]
    )


def _finite(logprob: float) -> float:
    return max(MIN_LOGPROB, logprob) if not math.isnan(logprob) else MIN_LOGPROB
