"""vLLM's side of engines/first_step.py: a scheduler that lets an idle engine's first requests
settle before its first step. vLLM loads it by name in its engine core (`scheduler_cls`) and reads
its settings from `additional_config`; imported only there.

The server hands the first episodes of a batch over together (first_step.py), but they reach the
engine core one message at a time (each carries its pixels). Measured on an H200 (issue 40,
eighth round), the engine core's loop took the first one, found nothing else queued yet and ran a
step for it alone: the group of four handed over together still ran as 1 + the rest. This
scheduler, while the engine runs nothing, schedules nothing until `first_step_settle_ms` have
passed without a new request (at most `first_step_settle_cap_ms` after the first one): the engine
core keeps taking what arrives meanwhile, and the first step then holds the whole group. A lone
request waits the settle time once; a running engine is never held.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

from reward_server.engines.first_step import SETTLE_CAP_MS, SETTLE_MS

FQCN = f"{__name__}.settling_scheduler"


class Settling:
    """Mixed into vLLM's scheduler (the synchronous or the asynchronous one, as vLLM chose)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = getattr(self.vllm_config, "additional_config", None) or {}
        self.settle_s = float(extra.get(SETTLE_MS, 0)) / 1000
        self.settle_cap_s = float(extra.get(SETTLE_CAP_MS, 30)) / 1000
        self._first_arrival = self._last_arrival = 0.0
        self.settled_steps = 0  # steps that scheduled nothing while requests settled

    def add_request(self, request: Any) -> None:
        now = time.monotonic()
        if not self.running and not self.waiting:  # an idle engine: a new group begins
            self._first_arrival = now
        self._last_arrival = now
        super().add_request(request)

    def _settling(self) -> bool:
        if self.settle_s <= 0 or self.running or not self.waiting or getattr(self, "skipped_waiting", None):
            return False
        now = time.monotonic()
        return now - self._last_arrival < self.settle_s and now - self._first_arrival < self.settle_cap_s

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self._settling():
            return super().schedule(*args, **kwargs)
        # an empty step, as vLLM runs when it has only finished requests to clear: the waiting
        # queue is set aside for it and put back whole (nothing is added while it runs)
        waiting, self.waiting = self.waiting, create_request_queue(self.policy)
        try:
            self.settled_steps += 1
            return super().schedule(*args, **kwargs)
        finally:
            self.waiting = waiting


class SettlingScheduler(Settling, Scheduler):
    pass


class SettlingAsyncScheduler(Settling, AsyncScheduler):
    pass


def settling_scheduler(vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
    """What vLLM's engine core calls as its scheduler class: the settling variant of the scheduler
    vLLM itself would have chosen (asynchronous scheduling or not)."""
    cls = SettlingAsyncScheduler if vllm_config.scheduler_config.async_scheduling else SettlingScheduler
    return cls(vllm_config, *args, **kwargs)
