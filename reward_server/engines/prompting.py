"""Rendering a ChatPrompt with the checkpoint's own chat template and resolving answer tokens.

Both engines render through the same processor call, so the same request gives the same
prompt text whichever engine runs it.
"""

from __future__ import annotations

import functools
from array import array
from typing import Any

from reward_server.engines.io import ChatPrompt

# Distinct prompts kept rendered: a batch's episodes share a few task texts and a curve's points
# differ only in their count of clips, so a LIBERO batch of 16-point curves (10 tasks) needs 160.
# At most ~25 MB: 256 texts and token arrays of a full 8192-token context.
PROMPT_CACHE_SIZE = 256


def load_processor(model_path: str) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path)


def render(processor: Any, chat: ChatPrompt) -> str:
    return processor.apply_chat_template(
        chat.to_messages(), tokenize=False, add_generation_prompt=True, **dict(chat.template_kwargs)
    )


class PromptCache:
    """`render` and the tokenizer, once per distinct prompt. A prompt's text depends only on its
    ChatPrompt (media are placeholders there) and its token ids only on the text, while an input
    thread spent ~0.25 ms a request on them, every time: 3.8-4.0 ms of the ~20 ms a 16-point
    curve took to process on one CPU thread, all of it holding the interpreter lock; 0.7 ms with
    the cache (docs/bench/cpu_prompt_cache_2026-11-29.json). Rendered every time: a template that
    reads the clock (`strftime_now`), and a chat request's template kwargs (values that compare
    equal can print differently: True and 1). The token ids come back as a new list: vLLM may
    keep what it is given."""

    def __init__(self, processor: Any, size: int = PROMPT_CACHE_SIZE):
        self._processor = processor
        template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", "")
        self.caches_text = "strftime_now" not in str(template)
        self._text = functools.lru_cache(maxsize=size)(self._render)
        self._ids = functools.lru_cache(maxsize=size)(self._encode)

    def _render(self, chat: ChatPrompt) -> str:
        return render(self._processor, chat)

    def _encode(self, text: str) -> array:
        return array("q", self._processor.tokenizer.encode(text, add_special_tokens=False))

    def text(self, chat: ChatPrompt) -> str:
        if not self.caches_text or chat.template_kwargs:
            return render(self._processor, chat)
        return self._text(chat)

    def token_ids(self, text: str) -> list[int]:
        return list(self._ids(text))

    def hits(self) -> int:
        return self._text.cache_info().hits + self._ids.cache_info().hits


def video_metadata(num_frames: int, fps: float, start: int = 0) -> dict:
    """Metadata for frames we already sampled (engines must not sample again), the first at
    episode frame `start` (Qwen3-VL's processor prints each pair's timestamp from the indices)."""
    return {
        "fps": fps,
        "total_num_frames": start + num_frames,
        "frames_indices": list(range(start, start + num_frames)),
        "duration": (start + num_frames) / fps,
        "video_backend": "opencv",
        "do_sample_frames": False,
    }


def hf_video_metadata(num_frames: int, fps: float, start: int = 0) -> dict:
    """The same for a transformers processor call (sampling is a processor argument there)."""
    meta = video_metadata(num_frames, fps, start)
    del meta["do_sample_frames"]
    return meta
