"""vLLM's vision-encoder CUDA graphs for the steps that fit one graph; larger steps run as before.

A batch of episodes reaches the engine as its bytes arrive, so its first steps each start one to
three episodes. Such a step's encoder does ~8 ms of GPU work per episode, but launching the
compiled tower's 32 blocks from Python costs the engine core ~1 ms a block, so the GPU waits; the
steps after them hold 8-12 episodes and keep it busy (issue 40, rounds 7 and 13). vLLM 0.24 can
capture the encoder in CUDA graphs per token budget (`compilation_config.cudagraph_mm_encoder`)
and then packs every step's items into graph replays of at most its largest budget. Captured at
the 16-frame episode's own sizes (`encoder_cudagraph_token_budgets` multiples of its 648 tokens),
the replays cut the hook path's front from 0.18-0.21 s to 0.09-0.10 s, but the large steps, split
into replays of 8 episodes, ran ~60 ms longer on the GPU (docs/bench/h200_2026-11-30_issue40_round13/).

`--engine-option encoder_graphs=small` keeps the graphs for what they are good at: a step whose
items all fit one replay (no more items than the graphs' batch, no more tokens than the largest
budget) replays it; any larger step returns no graph output, and vLLM's model runner then calls
the encoder itself, as it does without graphs. The budgets and their batch are vLLM's settings
(`compilation_config`); this module reads them from the manager vLLM built.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

OPTION = "encoder_graphs"
METHOD = "reward_encoder_graphs_small_steps"
_MARK = "_reward_small_steps"


def fits_one_replay(manager: Any, mm_kwargs: dict[str, Any]) -> bool:
    """Whether one of `manager`'s graphs holds every item of this encoder call."""
    tokens = [spec.output_tokens for spec in manager.model.get_encoder_cudagraph_item_specs(mm_kwargs)]
    return len(tokens) <= manager.max_batch_size and sum(tokens) <= max(manager.token_budgets)


def small_steps_only(manager: Any) -> bool:
    """Make vLLM's encoder graph manager answer None (vLLM then runs the encoder eagerly) for calls
    that do not fit one replay; False where the manager lacks what this reads (another vLLM)."""
    needed = ("execute", "model", "max_batch_size", "token_budgets")
    if not all(hasattr(manager, name) for name in needed):
        return False
    if not hasattr(manager.model, "get_encoder_cudagraph_item_specs"):
        return False
    if getattr(manager.execute, _MARK, False):
        return True
    original = manager.execute

    def execute(mm_kwargs: dict[str, Any]) -> Any:
        if not fits_one_replay(manager, mm_kwargs):
            return None
        return original(mm_kwargs)

    setattr(execute, _MARK, True)
    manager.execute = execute
    return True


class EncoderGraphSteps:
    """vLLM's worker extension: the method the engine calls once after start."""

    def reward_encoder_graphs_small_steps(self) -> dict[str, Any]:
        runner = getattr(self, "model_runner", None)
        manager = getattr(runner, "encoder_cudagraph_manager", None)
        if manager is None:
            return {"small_steps": False, "skipped": "vLLM runs no encoder CUDA graphs (cudagraph_mm_encoder is off)"}
        if not small_steps_only(manager):
            return {"small_steps": False, "skipped": "this vLLM's encoder graph manager is not the one this reads"}
        return {"small_steps": True, "budgets": list(manager.token_budgets), "items": manager.max_batch_size}
