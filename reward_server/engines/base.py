"""The contract every engine implements: load, run a batch, report health, shut down."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from reward_server.engine_io import EngineOutput, EngineRequest


class EngineDead(RuntimeError):
    """The engine cannot serve any more requests; the server reports `failed`."""


@dataclass
class EngineConfig:
    """Engine settings taken from the server's CLI / YAML (one place, engine-neutral names)."""

    model_path: str
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    mm_encoder_attn_backend: str | None = None
    enforce_eager: bool = False
    cpu_kv_cache_gib: float | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class EngineStats:
    batches: int = 0
    requests: int = 0
    max_batch_size: int = 0  # the largest batch this engine was handed at once
    max_running: int = 0  # the most requests the engine's own scheduler ran together, where it says

    def record_batch(self, size: int) -> None:
        self.batches += 1
        self.requests += size
        self.max_batch_size = max(self.max_batch_size, size)


class Engine(ABC):
    name: str
    # How many batches may be in the engine at once: an engine with its own scheduler takes
    # new work while earlier batches run; a plain forward-pass engine takes one at a time.
    max_concurrent_batches: int = 1

    def __init__(self, config: EngineConfig):
        self.config = config
        self.stats = EngineStats()

    @property
    def model_name(self) -> str:
        return self.config.model_path

    @abstractmethod
    async def start(self) -> None:
        """Load the model; raise with a clear message if it cannot be loaded."""

    @abstractmethod
    async def run_batch(self, requests: list[EngineRequest]) -> list[EngineOutput | Exception]:
        """Run the requests together; one output or one exception per request, in order."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raise EngineDead if the engine can no longer serve."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        pass
