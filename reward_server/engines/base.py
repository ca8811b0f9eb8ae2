"""The contract every engine implements: start, generate one request, health, shutdown.

The shape of vLLM's engine client: the service submits each episode on its own and awaits its
output; batching is the engine's business (vLLM schedules continuously, the transformers
engine gathers micro-batches). Cancelling the awaiting task aborts the request inside the
engine, so an episode whose client left or whose deadline passed stops using the model.

An output is the model's answer only if the engine finished the request itself: one the engine
ended on its own account (an abort the server did not ask for: the engine core shutting down on a
signal, someone aborting it from outside), one that ended unfinished, or one with nothing in it
never reaches a parser (`unusable_output`); it is a retryable request failure. The server's own
aborts (client gone, deadline, drain) never produce an output: they cancel the awaiting task.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from reward_server.engines.generation_defaults import checkpoint_sampling_defaults
from reward_server.engines.io import EngineOutput, EngineRequest

logger = logging.getLogger(__name__)


async def gather_all(coros: list) -> list:
    """Await every coroutine together; if one fails or the caller is cancelled, cancel the rest."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class EngineDead(RuntimeError):
    """The engine cannot serve any more requests; the server reports `failed`."""


class EngineRequestFailed(RuntimeError):
    """The engine failed one request and stays healthy (a retryable request-level error): the
    client may send it again."""


class EngineOutputUnusable(EngineRequestFailed):
    """The engine ended a request without the model's answer (aborted by the engine, unfinished,
    empty): retryable, never parsed."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # abort, unfinished, empty (the label counted in /stats and /metrics)


# finish reasons after which an output holds the model's whole answer (vLLM's names)
FINISHED_REASONS = frozenset({"stop", "length"})


def unusable_output(request: EngineRequest, output: EngineOutput) -> EngineOutputUnusable | None:
    """Why this output is not the model's answer to this request, or None if it is. `length` is an
    answer (the model used every token it was allowed: a parser judges it); `abort` here is the
    engine's own abort, since the server's aborts cancel the request instead of returning."""
    reason = output.finish_reason
    if reason == "abort":
        return EngineOutputUnusable(
            "abort", "the engine aborted this request (not the server: its engine process stopping, "
            "or an abort from outside); send it again"
        )  # fmt: skip
    if reason not in FINISHED_REASONS:
        return EngineOutputUnusable(
            "unfinished", f"the engine's output ended unfinished (finish_reason {reason!r}); send it again"
        )
    if request.sampling.mode == "logprob":
        pair = (output.logprob_positive, output.logprob_negative)
        if any(v is None for v in pair):
            return EngineOutputUnusable("empty", "the engine returned no log-probabilities for this request")
    elif not output.output_tokens and not output.text:
        return EngineOutputUnusable("empty", "the engine returned an empty output (no token) for this request")
    return None


class EngineInputRejected(ValueError):
    """The engine refused one request's input as sent (a prompt longer than the model's context,
    a token id outside the vocabulary): the client must change it."""


class AnswerWordsUnsupported(ValueError):
    """The checkpoint's tokenizer cannot answer logprob questions (an answer word is several tokens)."""


@dataclass
class EngineConfig:
    """Engine settings taken from the server's CLI / YAML (one place, engine-neutral names)."""

    model_path: str
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None  # None: 0.9 on GPUs, what fits the free memory on CPU
    max_num_seqs: int = 256  # sized for progress curves (docs/performance.md)
    max_num_batched_tokens: int | None = None
    mm_encoder_attn_backend: str | None = None
    mm_processor_cache_gb: float | None = None  # vllm: None: the engine's default for the device
    # how long the server drains on SIGTERM (--shutdown-timeout-s): an engine with processes of its
    # own keeps their in-flight requests running that long when the signal reaches them too
    drain_s: float = 0.0
    enforce_eager: bool = False
    cpu_kv_cache_gib: float | None = None
    max_batch_size: int = 64  # micro-batching engines: requests per forward pass
    batch_wait_ms: float = 100.0  # micro-batching engines (transformers): how long a batch waits to fill
    seed: int = 0
    max_images: int = 16  # images one request may carry (chat requests; PRIMO-R1 sends 2)
    max_videos: int = 32  # videos one request may carry (a progress curve's prefix: one per point)
    options: dict[str, Any] = field(default_factory=dict)  # engine-specific (the fake engine's script)


@dataclass
class EngineStats:
    requests: int = 0  # submitted
    finished: int = 0
    aborted: int = 0  # cancelled by the server before they finished (client gone, deadline, drain)
    # ended by the engine without the model's answer, by reason (abort: the engine's own, not the
    # server's; unfinished; empty): answered as retryable failures, never parsed (unusable_output)
    unusable_outputs: dict[str, int] = field(default_factory=dict)
    running: int = 0  # submitted and not yet finished or aborted
    # requests that produced their first output token (the engine is generating them); a test
    # that acts on a running generation waits for this count to move, never for a duration
    first_tokens: int = 0
    generating: int = 0  # of those, not yet finished or aborted
    max_running: int = 0  # the most requests in the engine at once
    peak_running: int = 0  # the same since the last `take_peak` (what /stats reports as `peak_running`)
    batches: int = 0  # micro-batches run (engines that batch themselves)
    max_batch_size: int = 0  # largest micro-batch; vLLM: most requests its scheduler ran in one step
    curves: int = 0  # progress curves asked for (each point is one of `requests`)
    prompt_tokens: int = 0  # prompt tokens of finished requests
    cached_tokens: int = 0  # of those, taken from the prefix cache (engines that have one: vLLM)
    prefix_cache_queries: int = 0  # vLLM's own prefix-cache counters: tokens looked up
    prefix_cache_hits: int = 0  # ... and found
    mm_cache_queries: int = 0  # vLLM's multimodal processor cache: items looked up (video clips, images)
    mm_cache_hits: int = 0  # ... and found processed already (a curve's shared clips)

    def submitted(self) -> None:
        self.requests += 1
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.peak_running = max(self.peak_running, self.running)

    def take_peak(self) -> int:
        peak, self.peak_running = self.peak_running, self.running
        return peak

    def ended(self, aborted: bool) -> None:
        self.running -= 1
        if aborted:
            self.aborted += 1
        else:
            self.finished += 1

    def reset(self) -> None:
        """Zero every counter (after the start-up warm-up: the counters describe real requests)."""
        for name, value in EngineStats().__dict__.items():
            setattr(self, name, value)

    def record_output(self, output: EngineOutput) -> None:
        self.prompt_tokens += output.prompt_tokens or 0
        self.cached_tokens += output.cached_tokens or 0

    def record_batch(self, size: int) -> None:
        self.batches += 1
        self.max_batch_size = max(self.max_batch_size, size)

    def as_dict(self) -> dict[str, Any]:
        """The counters, with `peak_running` since the previous call (reset here)."""
        out = dict(self.__dict__)
        out["peak_running"] = self.take_peak()
        return out


# Sampling options beyond temperature / top_p / max_tokens that a chat request may set (engines/io.py: Sampling)
SAMPLING_OPTIONS = frozenset(
    {
        "seed",
        "stop",
        "logprobs",
        "allowed_token_ids",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    }
)


class Engine(ABC):
    name: str
    sampling_options: frozenset[str] = SAMPLING_OPTIONS  # those this engine honours (others are refused)

    def __init__(self, config: EngineConfig):
        self.config = config
        self.stats = EngineStats()
        self._live: set[str] = set()  # request ids in generate()
        self._generating: set[str] = set()  # of those, the ones whose first token is out

    @property
    def model_name(self) -> str:
        return self.config.model_path

    @abstractmethod
    async def start(self) -> None:
        """Load the model; raise with a clear message if it cannot be loaded."""

    async def generate(self, request: EngineRequest) -> EngineOutput:
        """Run one request (request_id unique among those running). Cancelling the caller's
        task stops it in the engine."""
        self.stats.submitted()
        self._live.add(request.request_id)
        aborted = True
        try:
            output = await self._generate(request)
            aborted = False
            unusable = unusable_output(request, output)
            if unusable is not None:
                self.stats.unusable_outputs[unusable.reason] = self.stats.unusable_outputs.get(unusable.reason, 0) + 1
                logger.warning("the engine ended request %s without an answer: %s", request.request_id, unusable)
                raise unusable
            self.stats.record_output(output)
            return output
        finally:
            self.stats.ended(aborted)
            self._live.discard(request.request_id)
            if request.request_id in self._generating:
                self._generating.discard(request.request_id)
                self.stats.generating -= 1

    def first_token(self, request_id: str) -> None:
        """The engine produced this request's first output token (once per request)."""
        if request_id in self._live and request_id not in self._generating:
            self._generating.add(request_id)
            self.stats.first_tokens += 1
            self.stats.generating += 1

    async def generate_curve(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        """The points of a progress curve (Profile.build_curve: each prompt a prefix of the last
        one's up to its question), answered in order. Here all go in at once, so an engine that
        batches runs them together; an engine with a prefix cache orders them to reuse it.
        Cancelling the caller aborts every point."""
        self.stats.curves += 1
        return await gather_all([self.generate(r) for r in requests])

    @abstractmethod
    async def _generate(self, request: EngineRequest) -> EngineOutput:
        """The engine's own work for one request; must stop that work when cancelled."""

    @abstractmethod
    def answer_token_ids(self, word: str) -> list[int]:
        """The token ids of an answer word (after start)."""

    def check_answer_words(self, words: tuple[str, ...], score_mode: str = "logprob") -> None:
        """Raise AnswerWordsUnsupported unless every word is one token (logprob and p_true read one next token)."""
        split = {w: n for w in words if (n := len(self.answer_token_ids(w))) != 1}
        if split:
            detail = ", ".join(f"{w!r} is {n} tokens" for w, n in split.items())
            raise AnswerWordsUnsupported(
                f"score_mode {score_mode} reads one next token, but this checkpoint's tokenizer splits the answer "
                f"words ({detail}); use score_mode auto/percentage/unit with this model"
            )

    def vocab_size(self) -> int | None:
        """Token ids run from 0 to this (exclusive), after start; None if unknown."""
        return None

    def memory_held(self) -> dict[str, float | None]:
        """Memory the engine keeps on purpose beyond the model and its KV cache (vLLM's processor
        cache), for /stats and /metrics; empty if it keeps none."""
        return {}

    def sampling_defaults(self) -> dict[str, Any]:
        """What a chat request that leaves a sampling field unset gets instead of OpenAI's neutral
        value (after start): the checkpoint's generation config, as `vllm serve` reads it
        (generation_defaults.py). A default this engine cannot apply is left out, with a warning."""
        defaults = checkpoint_sampling_defaults(self.config.model_path)
        dropped = {k: v for k, v in defaults.items() if k in SAMPLING_OPTIONS and k not in self.sampling_options}
        if dropped:
            logger.warning(
                "the checkpoint's generation config sets %s, which the %s engine cannot apply; chat requests "
                "that leave them unset run without them (--engine vllm applies them)",
                dropped,
                self.name,
            )
        return {k: v for k, v in defaults.items() if k not in dropped}

    def patch_table(self) -> list[dict[str, Any]]:
        """What this engine changes in the library it runs, one row per declared patch (patch,
        state, reason: vLLM's engines/vllm/patches.py), for /stats; empty where it changes nothing."""
        return []

    async def freeze_heap(self) -> None:  # noqa: B027 - optional hook
        """Once warm: freeze the heap of the engine's own processes, where it has any (vLLM's engine
        core; engines/vllm/heap.py). Nothing where the engine runs in the server's process, whose
        heap the service freezes itself."""

    async def start_profile(self) -> None:
        """Start tracing the engine's work (vLLM's torch profiler); NotImplementedError, saying why,
        where this engine has none or was started without it."""
        raise NotImplementedError(f"the {self.name} engine has no profiler")

    async def stop_profile(self) -> None:
        """Stop tracing; the engine writes its trace where it was configured to."""
        raise NotImplementedError(f"the {self.name} engine has no profiler")

    @abstractmethod
    async def check_health(self) -> None:
        """Raise EngineDead if the engine can no longer serve."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        pass
