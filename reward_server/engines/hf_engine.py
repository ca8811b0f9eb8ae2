"""The transformers engine: requests gathered into micro-batches, one padded call per batch.

A forward pass takes the batch it is given, so requests that arrive within `batch_wait_ms` of
each other (up to `max_batch_size`) run together; a batch is split by decoding settings and
each group runs as one call on a single worker thread, so the event loop stays free and the
model never sees two calls at once. A cancelled request is dropped before its batch runs, and
a running `generate` stops producing tokens for it (a per-row stopping criterion).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from reward_server.engines.base import SAMPLING_OPTIONS, Engine, EngineConfig, EngineDead, EngineInputRejected
from reward_server.engines.io import EngineOutput, EngineRequest, Sampling, TokenLogprob
from reward_server.engines.prompting import PromptCache, hf_video_metadata, load_processor
from reward_server.engines.step_floor import OPTION, HFStepFloor

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    request: EngineRequest
    future: asyncio.Future
    cancelled: bool = False  # read by the worker thread's stopping criterion
    enqueued: float = field(default_factory=time.perf_counter)


class HFEngine(Engine):
    name = "hf"
    # transformers' generate has no presence / frequency penalty
    sampling_options = SAMPLING_OPTIONS - {"presence_penalty", "frequency_penalty"}

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._model: Any = None
        self._processor: Any = None
        self._prompts: PromptCache | None = None
        self._device = "cpu"
        self._dead: str | None = None
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._loop_task: asyncio.Task | None = None
        floor = config.options.get(OPTION)
        self._step_floor = HFStepFloor(float(floor)) if floor else None  # tests only (step_floor.py)

    def load(self) -> None:
        """Load the model on this thread (start() runs it on the engine's worker thread)."""
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
        self._prompts = PromptCache(self._processor)
        self._model = AutoModelForImageTextToText.from_pretrained(
            c.model_path, dtype=dtype, attn_implementation="sdpa"
        ).to(self._device)
        self._model.eval()

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self.load)
        self._loop_task = asyncio.create_task(self._batch_loop(), name="hf-batcher")

    def answer_token_ids(self, word: str) -> list[int]:
        return self._processor.tokenizer.encode(word, add_special_tokens=False)

    async def _generate(self, request: EngineRequest) -> EngineOutput:
        if self._dead:
            raise EngineDead(self._dead)
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(pending)
        try:
            return await pending.future
        except asyncio.CancelledError:
            pending.cancelled = True
            raise

    # --- micro-batching ----------------------------------------------------------------------

    async def _collect(self) -> list[_Pending]:
        """A micro-batch: requests keep joining while they arrive within `batch_wait_ms` of each
        other (the episodes of one batch body arrive a few ms apart as their bytes stream in),
        up to `max_batch_size` or ten waits in all."""
        batch = [await self._queue.get()]
        wait = self.config.batch_wait_ms / 1000
        deadline = time.perf_counter() + 10 * wait
        while len(batch) < self.config.max_batch_size:
            try:
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = min(wait, deadline - time.perf_counter())
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return [p for p in batch if not p.cancelled]

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            if not batch:
                continue
            self.stats.record_batch(len(batch))
            groups: dict[tuple, list[_Pending]] = defaultdict(list)
            for p in batch:
                groups[_group_key(p.request)].append(p)
            for group in groups.values():
                try:
                    outputs = await loop.run_in_executor(self._executor, self._run_group, group)
                except asyncio.CancelledError:  # shut down mid-batch: its requests get no output
                    for p in batch:
                        p.cancelled = True  # the worker thread's generate stops at its next step
                        if not p.future.done():
                            p.future.set_exception(EngineDead("the transformers engine shut down during this batch"))
                    raise
                except Exception as exc:  # one bad group must not take the others down
                    logger.exception("transformers batch of %d failed", len(group))
                    if _is_fatal(exc):
                        self._dead = f"{type(exc).__name__}: {exc}"
                        exc = EngineDead(self._dead)
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    continue
                for p, out in zip(group, outputs, strict=True):
                    out.queue_ms = (out.started - p.enqueued) * 1000 if out.started else 0.0
                    if not p.future.done():
                        p.future.set_result(out)

    # --- the model call (worker thread) ------------------------------------------------------

    def model_inputs(self, requests: list[EngineRequest]) -> tuple[Any, list[str]]:
        """The processor's padded batch for requests of one decoding setting, and their prompts."""
        prompts = [self._prompts.text(r.chat) for r in requests]
        images = [img for r in requests for img in r.images]
        videos = [v for r in requests for v in r.videos()]
        extra: dict[str, Any] = {}
        if videos:
            extra = {"videos": videos, "videos_kwargs": {"fps": requests[0].fps, "do_sample_frames": False}}
            # the frames' places in time, as vLLM is given them (Qwen3-VL prints them as timestamps)
            extra["video_metadata"] = [
                hf_video_metadata(len(v), r.fps, r.video_start(i)) for r in requests for i, v in enumerate(r.videos())
            ]
        inputs = self._processor(
            text=prompts,
            images=images or None,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            **extra,
        )
        return inputs.to(self._device), prompts

    def _run_group(self, group: list[_Pending]) -> list[EngineOutput]:
        requests = [p.request for p in group]
        started = time.perf_counter()
        inputs, prompts = self.model_inputs(requests)
        outputs = self.forward(inputs, prompts, requests[0].sampling, _StopCancelled(group, self.first_token))
        elapsed = (time.perf_counter() - started) * 1000
        for out in outputs:
            out.engine_ms = elapsed
            out.started = started
        return outputs

    def forward(self, inputs: Any, prompts: list[str], s, stop: Any = None) -> list[EngineOutput]:
        """One forward pass (logprob) or generate call (generate) over a prepared batch."""
        import torch

        prompt_tokens = inputs["attention_mask"].sum(dim=1).tolist()
        outputs = [EngineOutput(prompt=p, prompt_tokens=int(n)) for p, n in zip(prompts, prompt_tokens, strict=True)]
        with torch.inference_mode():
            if s.mode == "logprob":
                ids = [self.answer_token_ids(w)[0] for w in s.candidates]
                logits = self._model(**inputs, logits_to_keep=1).logits[:, -1, :].float()
                # The same quantity vLLM reports after restricting the next token to the two answers.
                pair = torch.log_softmax(logits[:, ids], dim=-1)
                for out, (lp_pos, lp_neg) in zip(outputs, pair.tolist(), strict=True):
                    out.logprob_positive, out.logprob_negative = lp_pos, lp_neg
                    out.output_tokens = 0
                    out.finish_reason = "length"  # the one next token it was asked for, as vLLM says
            else:
                self._generate_text(inputs, outputs, s, stop)
        return outputs

    def max_model_len(self) -> int:
        """The context length: --max-model-len, else the checkpoint's."""
        if self.config.max_model_len:
            return self.config.max_model_len
        text = getattr(self._model.config, "text_config", self._model.config)
        return int(text.max_position_embeddings)

    def _new_tokens(self, inputs: Any, s: Sampling) -> int:
        """max_tokens, or (unset) the context left after the prompt, at most max_tokens_cap (a request
        that leaves it unset runs in a group of its own, so its prompt is the group's)."""
        if s.max_tokens is not None:
            return s.max_tokens
        prompt_len = int(inputs["input_ids"].shape[1])
        left = self.max_model_len() - prompt_len
        if left < 1:
            raise EngineInputRejected(
                f"the engine refused this input: the prompt has {prompt_len} tokens, the model's context "
                f"{self.max_model_len()}"
            )
        return min(left, s.max_tokens_cap or left)

    def _generate_text(self, inputs: Any, outputs: list[EngineOutput], s: Sampling, stop: Any) -> None:
        import torch

        tokenizer = self._processor.tokenizer
        sample = s.temperature > 0
        if s.seed is not None:
            torch.manual_seed(s.seed)  # a seeded sampled request runs in a group of its own (_group_key)
        processors = [_AllowOnly(s.allowed_token_ids)] if s.allowed_token_ids is not None else []
        if self._step_floor is not None:
            processors.append(self._step_floor)
        new_tokens_max = self._new_tokens(inputs, s)
        eos = self._model.generation_config.eos_token_id
        eos_ids = [*(eos if isinstance(eos, list) else [eos]), *s.stop_token_ids]
        if s.ignore_eos:
            min_new = new_tokens_max
        else:
            min_new = min(s.min_tokens, new_tokens_max) or None
        generated = self._model.generate(
            **inputs,
            max_new_tokens=new_tokens_max,
            do_sample=sample,
            temperature=s.temperature if sample else None,
            top_p=s.top_p if sample else None,
            top_k=s.top_k if sample and s.top_k > 0 else None,
            min_p=s.min_p if sample and s.min_p > 0 else None,
            repetition_penalty=s.repetition_penalty if s.repetition_penalty != 1.0 else None,
            min_new_tokens=min_new,
            eos_token_id=eos_ids,
            stop_strings=list(s.stop) or None,
            tokenizer=tokenizer if s.stop else None,
            logits_processor=processors or None,
            stopping_criteria=[stop] if stop is not None else None,
            return_dict_in_generate=True,
            output_logits=s.logprobs is not None,
        )
        new_tokens = generated.sequences[:, inputs["input_ids"].shape[1] :]
        stop_ids = set(eos_ids)
        pad = tokenizer.pad_token_id
        answers = [_answer_tokens(tokens, stop_ids, min_new or 0, pad) for tokens in new_tokens.tolist()]
        logprobs = None
        if s.logprobs is not None:
            logprobs = _token_logprobs(generated.logits, [kept for kept, _ in answers], s.logprobs, tokenizer)
        for row, (out, (kept, stopped)) in enumerate(zip(outputs, answers, strict=True)):
            out.output_tokens = len(kept)
            out.finish_reason = "stop" if stopped else "length"
            # as vLLM: the token that stopped the answer is not part of its text unless asked for
            shown = kept[:-1] if stopped and not s.include_stop_str_in_output else kept
            out.text = tokenizer.decode(shown, skip_special_tokens=s.skip_special_tokens)
            hits = [(i, x) for x in s.stop if (i := out.text.find(x)) >= 0]
            if hits:  # as vLLM: a stop string ends the text, and is part of it only when asked for
                i, x = min(hits)
                end = i + len(x) if s.include_stop_str_in_output else i
                out.text, out.finish_reason = out.text[:end], "stop"
            if logprobs is not None:
                out.token_logprobs = logprobs[row]

    def vocab_size(self) -> int | None:
        return len(self._processor.tokenizer) if self._processor is not None else None

    async def check_health(self) -> None:
        if self._model is None:
            raise EngineDead("the transformers model is not loaded")
        if self._dead:
            raise EngineDead(self._dead)
        if self._loop_task is not None and self._loop_task.done():
            raise EngineDead("the transformers batching loop stopped")

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(EngineDead("the server is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._model = None


class _AllowOnly:
    """A logits processor: every token outside `allowed` gets no probability."""

    def __init__(self, allowed: tuple[int, ...]):
        self.allowed = list(allowed)

    def __call__(self, input_ids, scores):
        import torch

        mask = torch.full_like(scores, -math.inf)
        mask[:, self.allowed] = 0
        return scores + mask


def _answer_tokens(tokens: list[int], stop_ids: set[int], min_new: int, pad: int | None) -> tuple[list[int], bool]:
    """A row's generated tokens up to and including the token that stopped it (EOS or a stop token
    id, once `min_new` tokens are out), and whether one did; the padding after a row that ended
    early (a stop string, a cancelled row) is dropped. Pad and EOS may be the same id."""
    for i, token in enumerate(tokens):
        if token in stop_ids and i + 1 >= min_new:
            return tokens[: i + 1], True
    end = len(tokens)
    while end and tokens[end - 1] == pad:
        end -= 1
    return tokens[:end], False


def _group_key(request: EngineRequest) -> tuple:
    """Requests with equal keys run in one generate call. A seeded sampled request runs alone (one
    reseeded generator per call, so the same seed gives the same answer whatever else arrived, as
    vLLM's per-request generators do); so does one that leaves max_tokens unset (its length is the
    context left after its own prompt)."""
    s = request.sampling
    alone = s.mode == "generate" and (s.max_tokens is None or (s.seed is not None and s.temperature > 0))
    return (s.batch_key, request.fps, request.request_id if alone else "")


def _token_logprobs(logits: tuple, rows: list[list[int]], top_n: int, tokenizer: Any) -> list:
    """Per row, its answer tokens' raw log-probabilities (the model's, before temperature and the
    sampling processors, as vLLM returns them by default) with the top_n alternatives."""
    out: list[list[TokenLogprob]] = [[] for _ in rows]
    for step, step_logits in enumerate(logits):
        lp = step_logits.float().log_softmax(-1)
        top = lp.topk(top_n, dim=-1) if top_n > 0 else None
        for row, tokens in enumerate(rows):
            if step >= len(tokens):
                continue
            token = tokens[step]
            alts = ()
            if top is not None:
                alts = tuple(
                    (tokenizer.decode([i]), v)
                    for i, v in zip(top.indices[row].tolist(), top.values[row].tolist(), strict=True)
                )
            out[row].append(TokenLogprob(tokenizer.decode([token]), float(lp[row, token]), alts))
    return out


class _StopCancelled:
    """A generate() stopping criterion: rows whose request was cancelled are finished now."""

    def __init__(self, group: list[_Pending], first_token=None):
        self.group = group
        self.first_token = first_token  # Engine.first_token, told once per request on the event loop

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        if self.first_token is not None:  # called after each step: the first call follows the first token
            for p in self.group:
                if not p.cancelled:
                    p.future.get_loop().call_soon_threadsafe(self.first_token, p.request.request_id)
            self.first_token = None

        return torch.tensor([p.cancelled for p in self.group], dtype=torch.bool, device=input_ids.device)


def _is_fatal(exc: Exception) -> bool:
    """Errors after which the device state cannot be trusted (out of memory, CUDA faults)."""
    text = f"{type(exc).__name__} {exc}"
    return "CUDA error" in text or "OutOfMemoryError" in text
