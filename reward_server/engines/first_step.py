"""An idle engine's first step, given a few episodes instead of one:
`--engine-option first_step_batch=N` and `first_step_wait_ms=MS`.

A batch of episodes streams into the server: each one's input is processed (engines' input
threads) as its bytes arrive, and vLLM starts a step as soon as one request is there. On an idle
engine that first step holds one episode. Its cost is set by the CPU that launches its kernels
(the vision tower's 32 blocks and the language model's 28 layers, ~60 ms on an H200's host for
~20 ms of GPU work), and the episodes processed meanwhile wait for the second step: the GPU idles
for most of the first 100 ms of every batch (issue 40, seventh round: 127 ms of the 134 ms it
idled in a 1.6 s batch).

The gate: while the engine holds no request, a processed request whose siblings are still being
processed waits until N requests are ready (or none is left in processing, or MS have passed since
the first one waited); then all of them are handed over together, so the first step launches its
kernels once for N episodes. A request alone (nothing else in processing) and every request while
the engine is busy pass at once: the gate never delays a lone request or a running batch.

Handed over together is not yet one step: each request reaches vLLM's engine core as a message of
its own, and the core starts a step with what it has. `first_step_settle_ms` is the engine core's
half (vllm_settle.py): while it runs nothing, it waits that long after the latest request before
its first step.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from reward_server.engines.base import EngineStats

BATCH = "first_step_batch"
WAIT_MS = "first_step_wait_ms"
SETTLE_MS = "first_step_settle_ms"  # the engine's side (vllm_settle.py)
SETTLE_CAP_MS = "first_step_settle_cap_ms"
OPTIONS = (BATCH, WAIT_MS, SETTLE_MS, SETTLE_CAP_MS)


@dataclass
class GatherSettings:
    batch: int = 1  # 1: off
    wait_ms: float = 30.0
    settle_ms: float = 0.0  # 0: off
    settle_cap_ms: float = 30.0


def gather_settings(options: dict[str, Any], default_batch: int = 1, default_settle_ms: float = 0.0) -> GatherSettings:
    """The gate's settings from `--engine-option`s (checked: a bad value is an error naming what is allowed)."""
    allowed = (
        f"allowed {BATCH} a whole number >= 1 (1: off); {WAIT_MS}, {SETTLE_MS} (0: off) and "
        f"{SETTLE_CAP_MS} milliseconds from 0 to 1000"
    )
    try:
        settings = GatherSettings(
            batch=int(options.get(BATCH, default_batch)),
            wait_ms=float(options.get(WAIT_MS, GatherSettings.wait_ms)),
            settle_ms=float(options.get(SETTLE_MS, default_settle_ms)),
            settle_cap_ms=float(options.get(SETTLE_CAP_MS, GatherSettings.settle_cap_ms)),
        )
    except (TypeError, ValueError):
        given = {k: options[k] for k in OPTIONS if k in options}
        raise ValueError(f"--engine-option {given}: {allowed}") from None
    times = (settings.wait_ms, settings.settle_ms, settings.settle_cap_ms)
    if settings.batch < 1 or not all(0 <= t <= 1000 for t in times):
        raise ValueError(
            f"--engine-option {BATCH}={settings.batch}, {WAIT_MS}={settings.wait_ms:g}, "
            f"{SETTLE_MS}={settings.settle_ms:g}, {SETTLE_CAP_MS}={settings.settle_cap_ms:g}: {allowed}"
        )
    return settings


@dataclass
class FirstStepGather:
    settings: GatherSettings
    in_engine: int = 0  # requests handed to the engine and not answered
    processing: int = 0  # requests whose input is being processed
    held: list[asyncio.Future] = field(default_factory=list)
    stats: EngineStats = field(default_factory=EngineStats)  # the engine's: groups handed over together
    _timer: asyncio.TimerHandle | None = None

    @asynccontextmanager
    async def processing_input(self):
        """Around one request's input processing: the gate knows more are coming while it runs. The
        caller calls ready() right after it (no suspension between: it joins the held, in order)."""
        self.processing += 1
        try:
            yield
        except BaseException:
            self.processing -= 1
            if self.held and self.processing == 0:
                self._release()  # this one will not join them, and nothing else can
            raise
        self.processing -= 1

    async def ready(self, may_wait: bool = True) -> None:
        """A request's input is processed: return when it may go to the engine (see the module).
        `may_wait=False` passes at once (a curve's longest point, whose siblings wait for it)."""
        gate_on = self.settings.batch > 1 and may_wait
        if not gate_on or self.in_engine > 0 or (not self.held and self.processing == 0):
            self.in_engine += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.held.append(waiter)
        if len(self.held) >= self.settings.batch or self.processing == 0:
            self._release()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.settings.wait_ms / 1000, self._release)
        try:
            if waiter.done():  # released by this one: the earlier ones, woken now, go first
                await asyncio.sleep(0)
            await waiter
        except asyncio.CancelledError:
            if waiter in self.held:
                self.held.remove(waiter)
            elif not waiter.cancelled():
                self.in_engine -= 1  # released (and counted), then cancelled before it went in
            raise

    def done(self) -> None:
        """A request that passed ready() left the engine (answered, failed or aborted)."""
        self.in_engine -= 1

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # a waiter cancelled while held (its task not yet resumed to take itself out) is not counted
        held = [waiter for waiter in self.held if not waiter.done()]
        self.held = []
        self.in_engine += len(held)
        if held:
            self.stats.record_first_step(len(held))
        for waiter in held:  # in the order they became ready: the order they reach the engine
            waiter.set_result(time.monotonic())
