"""Rendering a ChatPrompt with the checkpoint's own chat template and resolving answer tokens.

Both engines render through the same processor call, so the same request gives the same
prompt text whichever engine runs it.
"""

from __future__ import annotations

from typing import Any

from reward_server.engines.io import ChatPrompt


def load_processor(model_path: str) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path)


def render(processor: Any, chat: ChatPrompt) -> str:
    return processor.apply_chat_template(
        chat.to_messages(), tokenize=False, add_generation_prompt=True, **dict(chat.template_kwargs)
    )


def video_metadata(num_frames: int, fps: float) -> dict:
    """Metadata for frames we already sampled (engines must not sample again)."""
    return {
        "fps": fps,
        "total_num_frames": num_frames,
        "frames_indices": list(range(num_frames)),
        "duration": num_frames / fps,
        "video_backend": "opencv",
        "do_sample_frames": False,
    }
