"""What a profile hands an engine, and what an engine hands back.

A profile (or the chat route) builds an `EngineRequest` (chat turns, images, at most one video,
sampling) without knowing which engine runs it; an engine answers an `EngineOutput` without
knowing who asked.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any, Literal

import numpy as np

Mode = Literal["generate", "logprob"]
Role = Literal["system", "developer", "user", "assistant"]  # passed to the chat template as sent


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    index: int  # into EngineRequest.images


@dataclass(frozen=True)
class VideoPart:
    """A video item; a request's videos fill its VideoParts in order (EngineRequest.videos())."""


Part = TextPart | ImagePart | VideoPart


@dataclass(frozen=True)
class Turn:
    role: Role
    parts: tuple[Part, ...]


def _content(parts: tuple[Part, ...]) -> list[dict]:
    content: list[dict] = []
    for part in parts:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            content.append({"type": "image"})
        else:
            content.append({"type": "video"})
    return content


@dataclass(frozen=True)
class ChatPrompt:
    system: str | None
    user: tuple[Part, ...]  # the last user turn, which the model answers
    history: tuple[Turn, ...] = ()  # turns between the system prompt and `user` (chat requests)
    template_kwargs: tuple[tuple[str, Any], ...] = ()  # extra chat-template variables (chat_template_kwargs)

    def to_messages(self) -> list[dict]:
        """The chat-template message list (HF / OpenAI style) for this prompt."""
        messages: list[dict] = []
        if self.system is not None:
            messages.append({"role": "system", "content": [{"type": "text", "text": self.system}]})
        for turn in self.history:
            messages.append({"role": turn.role, "content": _content(turn.parts)})
        messages.append({"role": "user", "content": _content(self.user)})
        return messages

    def texts(self) -> list[str]:
        """Every text part, in order (history first)."""
        parts = [p for turn in self.history for p in turn.parts] + list(self.user)
        return [p.text for p in parts if isinstance(p, TextPart)]


@dataclass(frozen=True)
class Sampling:
    mode: Mode = "generate"
    max_tokens: int | None = 32  # None: the context left after the prompt, at most `max_tokens_cap`
    max_tokens_cap: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False  # benchmarks of random weights need fixed output lengths
    candidates: tuple[str, str] = ("Yes", "No")  # logprob mode: (positive, negative) answer tokens
    # chat requests: what OpenAI's API lets a client ask for (neutral values: the engine's default)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # log-probabilities of generated tokens, with this many alternatives each
    allowed_token_ids: tuple[int, ...] | None = None
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0  # EOS and stop_token_ids are held back until this many tokens
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @property
    def batch_key(self) -> tuple:
        """Requests with equal keys can share one decoding call."""
        return astuple(self)


@dataclass
class EngineRequest:
    chat: ChatPrompt
    video: np.ndarray | None  # [T, H, W, 3] uint8, T even, H and W multiples of 28; chat requests may have none
    images: list[np.ndarray] = field(default_factory=list)  # [H, W, 3] uint8, H and W multiples of 28
    sampling: Sampling = field(default_factory=Sampling)
    fps: float = 2.0  # of the frames sent; Qwen2.5-VL turns it into temporal positions
    request_id: str = ""
    # Several videos in prompt order instead of `video`: the clips of a progress curve's prefix
    # (each prefix a prompt prefix of the next, so an engine with a prefix cache reuses them).
    clips: list[np.ndarray] = field(default_factory=list)
    # Engine-side ids of the video items (one per video, in order; vLLM's multi_modal_uuids): the
    # points of a curve give a shared clip one id, so it is processed and sent once per curve.
    clip_ids: list[str] = field(default_factory=list)
    # The same for the image items: a curve's points give the image they share (PRIMO-R1's first
    # frame, in front of the shared clips) one id, or no point's prompt shares a prefix past it.
    image_ids: list[str] = field(default_factory=list)
    # Where each video item's first frame lies in the episode (one per video, in order; empty: all
    # at 0): a curve's clips for a model that writes timestamps into its prompt (Qwen3-VL), so a
    # clip that begins at frame 8 of a 2 fps episode is shown at 4 s, not 0 s.
    video_starts: list[int] = field(default_factory=list)

    def videos(self) -> list[np.ndarray]:
        """Every video item in prompt order (one per VideoPart)."""
        return ([self.video] if self.video is not None else []) + list(self.clips)

    def video_start(self, index: int) -> int:
        """The episode frame index where video item `index` begins (video_starts; 0 if unset)."""
        return self.video_starts[index] if index < len(self.video_starts) else 0


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and its best alternatives (token text, logprob)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass
class EngineOutput:
    text: str = ""
    prompt: str = ""
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    logprob_positive: float | None = None  # logprob mode: log P(candidates[0])
    logprob_negative: float | None = None  # logprob mode: log P(candidates[1])
    engine_ms: float = 0.0
    queue_ms: float = 0.0  # waiting inside the engine before being scheduled, where the engine says
    input_ms: float = 0.0  # the engine's input processing (its model processor), where the engine says
    prefill_ms: float = 0.0  # scheduled until the first new token, where the engine says
    decode_ms: float = 0.0  # first to last new token, where the engine says
    started: float = 0.0  # perf_counter when the engine began this request's computation
    token_logprobs: list[TokenLogprob] | None = None  # when Sampling.logprobs asked for them
    cached_tokens: int | None = None  # prompt tokens taken from the engine's prefix cache, where it says
