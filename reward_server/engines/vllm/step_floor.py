"""vLLM's side of reward_server.engines.step_floor: a logits processor the engine core loads by
name (`reward_server.engines.vllm.step_floor:VllmStepFloor`), reading its floor from vLLM's
`additional_config`. Imported only inside vLLM's engine process."""

from __future__ import annotations

from typing import Any

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from reward_server.engines.step_floor import OPTION, StepFloor

FQCN = f"{__name__}:VllmStepFloor"


class VllmStepFloor(LogitsProcessor):
    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.floor = StepFloor(float(extra.get(OPTION, 0)))

    def is_argmax_invariant(self) -> bool:
        return False  # False keeps it applied on every step, greedy ones included

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: Any) -> Any:
        self.floor.wait()
        return logits
