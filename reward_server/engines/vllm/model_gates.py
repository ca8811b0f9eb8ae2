"""Which of our vLLM worker patches apply to which model type (the checkpoint's `model_type`).

The vision MLP padding (vision_mlp.py) and the on-device pixel normalization (pixel_norm.py) were
written for, checked against and measured on Qwen2.5-VL's vision tower: a merged gate/up MLP 3420
wide, and Qwen2-VL's patch layout and processor constants. Qwen3-VL's tower differs (a plain
two-layer MLP 4096 / 4304 wide, deepstack outputs, learned position embeddings), so they stay off
there rather than running on a tower they were never checked on. Encoder batching, the pixel cast,
step timing and the heap freeze are about vLLM's runner, not a tower: every model type gets them.
A checkpoint whose type cannot be read keeps every patch (the behaviour before the gate).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from reward_server.engines.vllm.pixel_norm import METHOD as NORM_METHOD
from reward_server.engines.vllm.vision_mlp import METHOD as ALIGN_METHOD

logger = logging.getLogger(__name__)

# worker method -> the model types it applies to
MODEL_TYPES: dict[str, frozenset[str]] = {
    ALIGN_METHOD: frozenset({"qwen2_5_vl"}),
    NORM_METHOD: frozenset({"qwen2_5_vl"}),
}


def applies_to(method: str, model_type: str | None) -> bool:
    """Whether the worker patch `method` applies to a checkpoint of `model_type` (None: unknown)."""
    types = MODEL_TYPES.get(method)
    return types is None or model_type is None or model_type in types


def checkpoint_model_type(model_path: str) -> str | None:
    """The `model_type` in a local checkpoint's config.json; None where there is none to read."""
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def gated_off(method: str, model_type: str | None) -> str | None:
    """Why the worker patch `method` stays off for this model type (the patch table's reason), or
    None where it applies."""
    if applies_to(method, model_type):
        return None
    return f"stays off for {model_type}: written and measured for {', '.join(sorted(MODEL_TYPES[method]))} only"


def gate(methods: list[str], model_type: str | None) -> list[str]:
    """The methods that apply to this model type; each one left out is logged with why."""
    kept = []
    for method in methods:
        if applies_to(method, model_type):
            kept.append(method)
        else:
            logger.info(
                "%s stays off: written and measured for %s, this checkpoint is %s",
                method,
                ", ".join(sorted(MODEL_TYPES[method])),
                model_type,
            )
    return kept
