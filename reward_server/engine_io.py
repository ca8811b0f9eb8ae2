"""What a profile hands an engine, and what an engine hands back.

A profile builds an `EngineRequest` (chat turns, images, one video, sampling) without knowing
which engine runs it; an engine answers an `EngineOutput` without knowing the profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Mode = Literal["generate", "logprob"]


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    index: int  # into EngineRequest.images


@dataclass(frozen=True)
class VideoPart:
    pass


Part = TextPart | ImagePart | VideoPart


@dataclass(frozen=True)
class ChatPrompt:
    system: str | None
    user: tuple[Part, ...]

    def to_messages(self) -> list[dict]:
        """The chat-template message list (HF / OpenAI style) for this prompt."""
        messages: list[dict] = []
        if self.system is not None:
            messages.append({"role": "system", "content": [{"type": "text", "text": self.system}]})
        content: list[dict] = []
        for part in self.user:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                content.append({"type": "image"})
            else:
                content.append({"type": "video"})
        messages.append({"role": "user", "content": content})
        return messages


@dataclass(frozen=True)
class Sampling:
    mode: Mode = "generate"
    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False  # benchmarks of random weights need fixed output lengths
    candidates: tuple[str, str] = ("Yes", "No")  # logprob mode: (positive, negative) answer tokens

    @property
    def batch_key(self) -> tuple:
        """Requests with equal keys can share one decoding call."""
        return (self.mode, self.max_tokens, self.temperature, self.top_p, self.ignore_eos, self.candidates)


@dataclass
class EngineRequest:
    chat: ChatPrompt
    video: np.ndarray  # [T, H, W, 3] uint8, T even, H and W multiples of 28
    images: list[np.ndarray] = field(default_factory=list)  # [H, W, 3] uint8
    sampling: Sampling = field(default_factory=Sampling)
    fps: float = 2.0  # of the frames sent; Qwen2.5-VL turns it into temporal positions
    request_id: str = ""


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
    started: float = 0.0  # perf_counter when the engine began this request's computation
