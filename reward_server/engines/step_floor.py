"""A floor under the time of one decoding step, for tests that act on a running generation.

`--engine-option step_floor_ms=N` (vLLM and transformers): every decoding step of the engine
lasts at least N ms, so a request for T tokens runs for at least T*N ms however fast the machine
generates. A test that aborts, drains or times out a generation waits for the engine to report
the request's first token (/stats `first_tokens`) and then knows the generation is still running
when it acts. It only slows the engine down: never set it when serving.
"""

from __future__ import annotations

import time

OPTION = "step_floor_ms"


class StepFloor:
    """Sleeps out what is left of the floor since the previous step (one instance per engine)."""

    def __init__(self, floor_ms: float):
        self.floor_s = max(0.0, float(floor_ms)) / 1000
        self.last = time.perf_counter()

    def wait(self) -> None:
        left = self.floor_s - (time.perf_counter() - self.last)
        if left > 0:
            time.sleep(left)
        self.last = time.perf_counter()


class HFStepFloor(StepFloor):
    """A transformers logits processor: called once per generated token of the batch."""

    def __call__(self, input_ids, scores):
        self.wait()
        return scores
