"""The OpenAI chat dialect: the subset of `POST /v1/chat/completions` and `GET /v1/models` the
server speaks, as pydantic models (the server imports them; clients may build requests with them).

Reward workers written for an OpenAI-compatible model server (RLinf's API reward worker, the
seed's ManiSkill worker) send one user turn of `image_url` parts and a `text` part and read
`choices[0].message.content`. What is modelled here is what the server honours; bounds a
person can reason about live here, limits that depend on the deployment (max_tokens, images
per request, the model name) are checked by the server. Fields other OpenAI-compatible servers
accept and this one does not model are ignored, except those that would change the answer if
silently dropped (`tools`, `response_format` other than text, `logit_bias`, `add_generation_prompt:
false`, ...): those are refused by the server with a message naming them. The answer's semantics
are `vllm serve`'s: sampling fields a request leaves unset taken from the checkpoint's generation
config (then OpenAI's neutral values), random sampling unless a seed is given, raw
log-probabilities, `max_tokens` defaulting to the context left, every message rendered by the
model's chat template as sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_MESSAGES = 256
MAX_PARTS = 1024  # content parts in one message
MAX_TEXT_CHARS = 262_144  # one text part (the engine's context length is the real bound)
MAX_URL_CHARS = 256 * 1024 * 1024  # a data URL carries the image itself; the body limit bounds it first
MAX_STOP = 16
MAX_STOP_CHARS = 1024
MAX_ALLOWED_TOKEN_IDS = 262_144
MAX_TOP_LOGPROBS = 20

MAX_CHOICES = 16  # n: each choice is one engine request, admitted as one unit of --max-queue
MAX_STOP_TOKEN_IDS = 256

# Fields `vllm serve` honours that this server does not build, with the values that leave the answer
# as it is: refused by name when set to anything else, never ignored (the answer would differ).
UNSUPPORTED_FIELDS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "tools": ("tool calling", ()),
    "tool_choice": ("tool calling", ("none", "auto")),
    "functions": ("function calling", ()),
    "function_call": ("function calling", ("none", "auto")),
    "parallel_tool_calls": ("tool calling", (True, False)),
    "logit_bias": ("logit_bias", ()),
    "prompt_logprobs": ("prompt logprobs", ()),
    "logprob_token_ids": ("logprobs of named token ids", ()),
    "best_of": ("best_of", (1,)),
    "use_beam_search": ("beam search", (False,)),
    "length_penalty": ("beam search's length_penalty", (1, 1.0)),
    "guided_json": ("guided decoding", ()),
    "guided_regex": ("guided decoding", ()),
    "guided_choice": ("guided decoding", ()),
    "guided_grammar": ("guided decoding", ()),
    "structured_outputs": ("structured outputs", ()),
    "bad_words": ("bad_words", ()),
    "truncate_prompt_tokens": ("prompt truncation", ()),
    "chat_template": ("a chat template sent with the request", ()),
    "documents": ("documents for the chat template", ()),
    "mm_processor_kwargs": ("multimodal processor arguments", ()),
    "add_special_tokens": ("add_special_tokens", (False,)),
    "add_generation_prompt": ("add_generation_prompt: false", (True,)),
    "continue_final_message": ("continuing the final message", (False,)),
    "spaces_between_special_tokens": ("spaces_between_special_tokens: false", (True,)),
    "return_tokens_as_token_ids": ("tokens as token ids", (False,)),
    "thinking_token_budget": ("a thinking token budget", ()),
    "reasoning_effort": ("reasoning_effort", ()),
    "vllm_xargs": ("vllm_xargs", ()),
    "media_io_kwargs": ("per-request media loading arguments (frames sampled from a video, ...)", ()),
    "repetition_detection": ("repetition detection (it ends an answer early)", ()),
    "return_token_ids": ("token ids in the answer", (False,)),
    "return_prompt_text": ("the rendered prompt in the answer", (False,)),
}


def is_neutral(name: str, value: Any) -> bool:
    """Whether an unsupported field's value leaves the answer as if it were absent."""
    if value is None or value == [] or value == {}:
        return True
    return any(value is v or (type(value) is type(v) and value == v) for v in UNSUPPORTED_FIELDS[name][1])


class _Lenient(BaseModel):
    """Parts of OpenAI's schema carry fields we neither need nor must refuse (`name`, `detail`)."""

    model_config = ConfigDict(extra="ignore")


class URLRef(_Lenient):
    url: str = Field(
        min_length=1,
        max_length=MAX_URL_CHARS,
        description="data:image/jpeg|png|webp;base64,... (video_url: data:video/mp4;base64,...), or "
        "file:///path under the server's --video-root; http(s) URLs are refused (the server fetches nothing)",
    )
    detail: str | None = Field(default=None, max_length=16, description="accepted and ignored")

    @field_validator("url")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain a NUL character")
        return value


def _url_object(value: Any) -> Any:
    # some clients send the URL as a bare string instead of {"url": ...}
    return {"url": value} if isinstance(value, str) else value


class TextContent(_Lenient):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class ImageContent(_Lenient):
    type: Literal["image_url"]
    image_url: URLRef

    @field_validator("image_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        return _url_object(value)


class VideoContent(_Lenient):
    type: Literal["video_url"]
    video_url: URLRef

    @field_validator("video_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        return _url_object(value)


ContentPart = Annotated[TextContent | ImageContent | VideoContent, Field(discriminator="type")]
Role = Literal["system", "developer", "user", "assistant"]


class ChatMessage(_Lenient):
    role: Role = Field(description="system / developer (a system turn), user, assistant; no tool turns")
    content: str | list[ContentPart] = Field(description="text, or a list of text / image_url / video_url parts")

    @field_validator("content")
    @classmethod
    def _bounded(cls, value: str | list) -> str | list:
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            raise ValueError(f"text longer than {MAX_TEXT_CHARS} characters")
        if isinstance(value, list) and len(value) > MAX_PARTS:
            raise ValueError(f"more than {MAX_PARTS} content parts")
        return value


class ChatCompletionRequest(BaseModel):
    """A chat completion request. Unknown fields are ignored (as other OpenAI-compatible servers
    do), so a worker that spreads its sampling settings into the body keeps working; fields that
    change the answer and are not built here are refused by the server."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, max_length=1024, description="must name the served model when given")
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=2.0,
        description="unset: the server's --temperature, else the checkpoint's generation config, else 1.0 "
        "(as vllm serve)",
    )
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=1_000_000, description="0 or -1: off")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="new tokens; unset: the context left after the prompt; at most the server's --max-tokens-limit",
    )
    max_completion_tokens: int | None = Field(default=None, ge=1, description="OpenAI's newer name of max_tokens")
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = Field(default=None, description=f"up to {MAX_STOP} strings")
    n: int | None = Field(
        default=None, ge=1, le=MAX_CHOICES, description="choices; with a seed, choice i samples with seed + i (as vLLM)"
    )
    logprobs: bool | None = Field(default=None, description="log-probabilities of the generated tokens")
    top_logprobs: int | None = Field(
        default=None,
        ge=-1,
        le=MAX_TOP_LOGPROBS,
        description="alternatives per token, with logprobs: true (0 or unset without it); -1 (the whole "
        "vocabulary) is refused as vllm serve refuses it at its default --max-logprobs 20",
    )
    allowed_token_ids: list[int] | None = Field(default=None, max_length=MAX_ALLOWED_TOKEN_IDS)
    stream: bool | None = Field(default=None, description="streaming is not built: true is refused (400)")
    stream_options: dict[str, Any] | None = Field(
        default=None,
        description="an object or null (as OpenAI and vLLM: false or a list is refused); only null or {} "
        "without streaming",
    )
    response_format: dict[str, Any] | None = Field(default=None, description="only {'type': 'text'}")
    user: str | None = Field(default=None, max_length=1024, description="accepted and ignored")
    # vLLM's extra parameters that change the answer and are honoured here, as vLLM does
    min_tokens: int = Field(default=0, ge=0, description="EOS and stop_token_ids are held back until this many tokens")
    ignore_eos: bool = Field(default=False, description="generate past the end-of-sequence token")
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    include_stop_str_in_output: bool = Field(default=False, description="keep the stop string that ended the text")
    skip_special_tokens: bool = Field(default=True, description="leave special tokens out of the text")
    echo: bool = Field(
        default=False,
        description="prepend the last message when it has the answer's role (never here: the last is a user turn)",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="extra variables for the model's chat template (enable_thinking, add_vision_id...)"
    )

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else value or []
        if len(items) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(not s or len(s) > MAX_STOP_CHARS for s in items):
            raise ValueError(f"stop strings must have 1 to {MAX_STOP_CHARS} characters")
        return value

    @field_validator("allowed_token_ids")
    @classmethod
    def _ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or min(value) < 0):
            raise ValueError("must be a non-empty list of token ids >= 0")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, value: list[int] | None) -> list[int] | None:
        if value and min(value) < 0:
            raise ValueError("token ids must be >= 0")
        return value

    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatCompletionMessage
    finish_reason: Literal["stop", "length"] = Field(description="stop: the model ended or a stop string; length")
    logprobs: ChoiceLogprobs | None = None


class Usage(BaseModel):
    prompt_tokens: int = Field(description="the rendered prompt, images and video included")
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(description="Unix time, seconds")
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "reward_server"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIError(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, permission_error, server_error")
    param: str | None = Field(default=None, description="the request field at fault, where one is")
    code: str | None = Field(default=None, description="the server's error type (as /score's error.type)")


class OpenAIErrorBody(BaseModel):
    """Every error under /v1 has OpenAI's shape (same statuses as /score)."""

    error: OpenAIError


def openai_error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    return "server_error" if status >= 500 else "invalid_request_error"
