"""One vision-encoder call per modality in each vLLM step, for prompts that mix images and videos.

vLLM (0.24 to 0.32) runs the vision encoder once per run of consecutive items of one modality
among the items a step schedules, in request order (its model runner says so in a FIXME: it keeps
the items' order). PRIMO-R1's prompt is [first frame (image), video, last frame (image), text],
so a step that starts 64 episodes makes ~128 encoder calls of one or two items each instead of
two, and each call costs about the same however small it is: on one H200 (7B shapes, 64
episodes) the prefill alone took 8.2 s where the Qwen profile's single video takes ~2 s for
half the tokens (issue 40).

vLLM stores every encoder output under its item's id and reads it back by id when it assembles
the prompt's embeddings, so the order the items are encoded in does not matter: this module
orders a step's items by modality (stably, so each modality keeps its order) before vLLM groups
them, and each step makes one call per modality. Each item is encoded on its own inside a call
(Qwen2.5-VL's vision tower separates items by their sequence lengths), so the embeddings are the
same up to rounding: larger batches run other bf16 kernels. On random weights, whose near-flat
logits turn rounding into other greedy tokens, 32-token answers matched on 37-45 of 64 episodes
between on and off, and on 50 (on) and 61 (off) of 64 between two servers of one setting.

It runs inside vLLM's worker: `ModalityBatching` is a mixin of the engine's vLLM
`worker_extension_cls` (engines/vllm/worker.py, which adds its method to the worker), and the
engine calls the method once through
`collective_rpc` after the engine started: by default on GPUs, where it was measured (one H200,
PRIMO-R1, 64 episodes: the prefill alone 8.2 -> 4.2 s, 256 new tokens 9.8 -> 5.9 s;
docs/bench/h200_2026-11-26_issue40/); `--engine-option encoder_batching=true|false` decides.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

OPTION = "encoder_batching"
METHOD = "reward_encoder_batching"

_MARK = "_reward_by_modality"


def by_modality(hashes: list, kwargs: list, refs: list) -> tuple[list, list, list]:
    """The three parallel lists of a step's encoder inputs (ids, (modality, data), placements)
    reordered so that items of one modality are adjacent, each modality in its original order."""
    if len({modality for modality, _ in kwargs}) < 2:
        return hashes, kwargs, refs
    order = sorted(range(len(kwargs)), key=lambda i: kwargs[i][0])
    return [hashes[i] for i in order], [kwargs[i] for i in order], [refs[i] for i in order]


def batch_runner_by_modality(runner: Any) -> bool:
    """Make this vLLM model runner encode each step's items one modality at a time; False where
    the runner has no such step (another vLLM version): vLLM then runs as it is."""
    original = getattr(runner, "_batch_mm_inputs_from_scheduler", None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True

    def batched(scheduler_output: Any) -> tuple[list, list, list]:
        return by_modality(*original(scheduler_output))

    setattr(batched, _MARK, True)
    runner._batch_mm_inputs_from_scheduler = batched
    return True


class ModalityBatching:
    """vLLM's worker extension: the method the engine calls once after start."""

    def reward_encoder_batching(self) -> bool:
        done = batch_runner_by_modality(getattr(self, "model_runner", None))
        if not done:
            logger.warning("this vLLM's model runner has no step to batch encoder inputs by modality; left as it is")
        return done
