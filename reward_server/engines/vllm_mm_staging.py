"""A step's image and video inputs gathered in ordinary (pageable) memory on their way to the GPU, not
in freshly pinned memory, inside vLLM's worker.

Before the vision encoder runs, vLLM's model runner concatenates the step's pixel tensors into one
buffer and copies it to the GPU. It asks for that buffer in pinned (page-locked) memory. Pinned
memory comes from CUDA's host allocator: PyTorch caches its blocks, but a buffer of a size it has
not cached yet is pinned page by page, and a step's buffer differs in size from step to step. On
one H200 (vLLM 0.24) a 49 MB concatenation took 318 and 26 ms into new pinned buffers, 1-2 ms into
cached ones, and 5-6 ms into pageable memory (`torch.cat`, 16 uint8 episodes). In the traced
batch of 64 episodes the GPU waited 93 and 40 ms on this concatenation
(docs/bench/h200_2026-11-27_issue40_round4/). Pageable memory costs the copy to the GPU one more
CPU pass through CUDA's staging buffers, which is short next to pinning.

It wraps the `group_and_batch_mm_kwargs` the model runner's module calls, so that it always asks
for pageable memory. Only the encoder's inputs are affected; vLLM's other pinned buffers stay.
`--engine-option pageable_mm_inputs=true|false` decides.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

logger = logging.getLogger(__name__)

OPTION = "pageable_mm_inputs"
METHOD = "reward_pageable_mm_inputs"
FUNCTION = "group_and_batch_mm_kwargs"

_MARK = "_reward_pageable"


def pageable_batching(module: Any) -> bool:
    """Make `module`'s group_and_batch_mm_kwargs gather into pageable memory; False where the module
    has no such function (another vLLM version): vLLM then runs as it is."""
    original = getattr(module, FUNCTION, None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    def grouped(*args: Any, **kwargs: Any) -> Any:
        kwargs["pin_memory"] = False
        return original(*args, **kwargs)

    setattr(grouped, _MARK, True)
    setattr(module, FUNCTION, grouped)
    return True


class PageableMmInputs:
    """vLLM's worker extension: the method the engine calls once after start."""

    def reward_pageable_mm_inputs(self) -> bool:
        runner = getattr(self, "model_runner", None)
        encode = getattr(type(runner), "_execute_mm_encoder", None)
        module = inspect.getmodule(encode) if encode is not None else None
        done = module is not None and pageable_batching(module)
        if not done:
            logging.getLogger(f"vllm.{__name__}").warning(
                "this vLLM's model runner has no %s to stage encoder inputs with; left as it is", FUNCTION
            )
        return done
