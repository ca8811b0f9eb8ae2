"""The transformers engine: one padded forward pass (or generate call) per micro-batch.

The server's batcher groups concurrent requests; this engine splits a batch by decoding
settings and runs each group as one call on a single worker thread, so the event loop stays
free and the model never sees two calls at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reward_server.engine_io import EngineOutput, EngineRequest
from reward_server.engines.base import Engine, EngineConfig, EngineDead
from reward_server.prompting import load_processor, render, single_token_id

logger = logging.getLogger(__name__)


class HFEngine(Engine):
    name = "hf"
    max_concurrent_batches = 1

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._model: Any = None
        self._processor: Any = None
        self._device = "cpu"
        self._dead: str | None = None

    def _load(self) -> None:
        import torch

        if self.config.data_parallel_size > 1 or self.config.tensor_parallel_size > 1:
            raise ValueError(
                "the transformers engine runs one model on one device; "
                "use --engine vllm for --data-parallel-size / --tensor-parallel-size > 1"
            )
        from transformers import AutoModelForImageTextToText

        c = self.config
        self._device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = "auto" if c.dtype == "auto" else getattr(torch, c.dtype)
        torch.manual_seed(c.seed)
        self._processor = load_processor(c.model_path)
        self._model = AutoModelForImageTextToText.from_pretrained(
            c.model_path, dtype=dtype, attn_implementation="sdpa"
        ).to(self._device)
        self._model.eval()

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _inputs(self, requests: list[EngineRequest]) -> tuple[Any, list[str]]:
        prompts = [render(self._processor, r.chat) for r in requests]
        images = [img for r in requests for img in r.images]
        inputs = self._processor(
            text=prompts,
            images=images or None,
            videos=[r.video for r in requests],
            videos_kwargs={"fps": requests[0].fps, "do_sample_frames": False},
            padding=True,
            padding_side="left",
            return_tensors="pt",
        )
        return inputs.to(self._device), prompts

    def _run_group(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        import torch

        started = time.perf_counter()
        inputs, prompts = self._inputs(requests)
        prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        s = requests[0].sampling
        outputs = [EngineOutput(prompt=p, prompt_tokens=int(n)) for p, n in zip(prompts, prompt_tokens, strict=True)]
        with torch.inference_mode():
            if s.mode == "logprob":
                ids = [single_token_id(self._processor.tokenizer, w) for w in s.candidates]
                logits = self._model(**inputs, logits_to_keep=1).logits[:, -1, :].float()
                # The same quantity vLLM reports after restricting the next token to the two answers.
                pair = torch.log_softmax(logits[:, ids], dim=-1)
                for out, (lp_pos, lp_neg) in zip(outputs, pair.tolist(), strict=True):
                    out.logprob_positive, out.logprob_negative = lp_pos, lp_neg
                    out.output_tokens = 0
            else:
                generated = self._model.generate(
                    **inputs,
                    max_new_tokens=s.max_tokens,
                    do_sample=s.temperature > 0,
                    temperature=s.temperature if s.temperature > 0 else None,
                    top_p=s.top_p if s.temperature > 0 else None,
                    top_k=None,
                    min_new_tokens=s.max_tokens if s.ignore_eos else None,
                )
                new_tokens = generated[:, inputs["input_ids"].shape[1] :]
                eos = self._model.generation_config.eos_token_id
                eos_ids = set(eos if isinstance(eos, list) else [eos])
                for out, tokens in zip(outputs, new_tokens.tolist(), strict=True):
                    pad = self._processor.tokenizer.pad_token_id
                    kept = [t for t in tokens if t != pad]
                    stopped = bool(kept) and kept[-1] in eos_ids
                    out.output_tokens = len(kept)
                    out.finish_reason = "stop" if stopped else "length"
                    out.text = self._processor.tokenizer.decode(kept, skip_special_tokens=True)
        elapsed = (time.perf_counter() - started) * 1000
        for out in outputs:
            out.engine_ms = elapsed
        return outputs

    def _run_batch_sync(self, requests: list[EngineRequest]) -> list[EngineOutput | Exception]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            groups[(r.sampling.batch_key, r.fps)].append(i)
        results: list[EngineOutput | Exception] = [RuntimeError("not run")] * len(requests)
        for indices in groups.values():
            try:
                for i, out in zip(indices, self._run_group([requests[i] for i in indices]), strict=True):
                    results[i] = out
            except Exception as exc:  # one bad group must not take the others down
                logger.exception("transformers batch of %d failed", len(indices))
                if _is_fatal(exc):
                    self._dead = f"{type(exc).__name__}: {exc}"
                    raise EngineDead(self._dead) from exc
                for i in indices:
                    results[i] = exc
        return results

    async def run_batch(self, requests: list[EngineRequest]) -> list[EngineOutput | Exception]:
        if self._dead:
            raise EngineDead(self._dead)
        self.stats.record_batch(len(requests))
        self.stats.max_running = max(self.stats.max_running, len(requests))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._run_batch_sync, requests)

    async def check_health(self) -> None:
        if self._model is None:
            raise EngineDead("the transformers model is not loaded")
        if self._dead:
            raise EngineDead(self._dead)

    async def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._model = None


def _is_fatal(exc: Exception) -> bool:
    """Errors after which the device state cannot be trusted (out of memory, CUDA faults)."""
    text = f"{type(exc).__name__} {exc}"
    return "CUDA error" in text or "OutOfMemoryError" in text
