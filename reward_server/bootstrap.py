"""Settings -> profile -> engine -> service -> app: the one place a server is assembled.

The CLI, Ray Serve replicas, the API docs generator, the benchmarks and the tests all build
through here, so a setting means the same thing everywhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from reward_protocol.frames import FrameSpec
from reward_protocol.score import DEFAULT_MAX_PIXELS, MAX_VIEWS
from reward_server.engines import Engine, EngineConfig, load_engine
from reward_server.engines.vllm.options import with_encoder_graph_sizes
from reward_server.profiles import Profile, SamplingDefaults, canonical_backend, load_profile
from reward_server.settings import ServerSettings

logger = logging.getLogger("reward_server")

DEFAULT_CACHE = Path(os.environ.get("REWARD_SERVER_CACHE", Path.home() / ".cache" / "reward_server"))


# backends whose model family is not Qwen2.5-VL -> the tiny_checkpoint preset of their family
TINY_PRESETS = {"qwen3_vl": "qwen3_vl"}


def tiny_checkpoint_dir(preset: str = "tiny") -> Path:
    name = "tiny-qwen2_5_vl" if preset == "tiny" else f"tiny-{preset}"
    return Path(os.environ.get("REWARD_SERVER_CACHE", DEFAULT_CACHE)) / name


def resolve(settings: ServerSettings) -> ServerSettings:
    """Fill what the settings leave open. Without --model-path the server serves the embedded
    random-weight checkpoint (built on first use), with the settings that checkpoint brings for
    small machines, wherever the user did not say otherwise."""
    # the name clients use for the model, from the path the user gave (not the embedded one's)
    settings = settings.model_copy(update={"served_model_name": settings.effective_served_model_name()})
    if settings.model_path is not None or settings.engine == "fake":
        return settings
    from reward_server.tiny_checkpoint import PRESETS, SMOKE_SETTINGS, ensure_checkpoint

    preset = TINY_PRESETS.get(canonical_backend(settings.backend), "tiny")  # the backend's model family
    path = str(ensure_checkpoint(tiny_checkpoint_dir(preset), PRESETS[preset]))
    logger.warning("no --model-path: serving a random-weight tiny checkpoint (%s); scores are meaningless", path)
    fill = {k: v for k, v in SMOKE_SETTINGS.items() if k not in settings.model_fields_set}
    return settings.model_copy(update={"model_path": path, **fill})


def build_profile(settings: ServerSettings) -> Profile:
    backend = canonical_backend(settings.backend)
    d = load_profile(backend).sampling_defaults
    return load_profile(
        backend,
        sampling=SamplingDefaults(
            max_tokens=settings.max_tokens or d.max_tokens,
            temperature=d.temperature if settings.temperature is None else settings.temperature,
            top_p=settings.top_p or d.top_p,
        ),
        default_score_mode=settings.score_mode,
        max_tokens_limit=settings.max_tokens_limit,
        partial_groups=settings.progress_partial_groups,
    )


def episode_tokens(settings: ServerSettings, spec: FrameSpec) -> tuple[int, int]:
    """(merged tokens, time slices) of one episode of the warm-up's shape (`--warmup-frames` square
    frames of `--warmup-size`), fitted onto the model's grid as the server fits real episodes."""
    height, width = spec.fit_size(settings.warmup_size, settings.warmup_size, DEFAULT_MAX_PIXELS)
    slices = spec.frame_count(settings.warmup_frames) // spec.temporal_factor
    return slices * (height // spec.pixel_factor) * (width // spec.pixel_factor), slices


def cuda_available() -> bool:
    """Whether the vllm engine will run on CUDA GPUs: the test its engine arguments make
    (VllmEngine.engine_kwargs). Asked in NVML mode, as vLLM's import sets it: torch's plain check
    initializes CUDA's driver in this process, and vLLM's engine core, forked from it, then cannot
    use the GPU ("Cannot re-initialize CUDA in forked subprocess")."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import torch

    return torch.cuda.is_available()


def engine_config(settings: ServerSettings, on_gpu: bool | None = None) -> EngineConfig:
    """The engine configuration these settings describe. `on_gpu`: whether vLLM runs on CUDA GPUs,
    which turns on the encoder switches the settings leave unset; None: asked of torch, only
    where it matters (the vllm engine, a switch left unset)."""
    backend = canonical_backend(settings.backend)
    if on_gpu is None:
        unset = None in (settings.compile_mm_encoder, settings.cudagraph_mm_encoder)
        on_gpu = settings.engine == "vllm" and unset and cuda_available()
    options = settings.engine_options(on_gpu=on_gpu)
    if settings.engine == "vllm":  # the encoder's CUDA graphs captured at the episodes' size
        options = with_encoder_graph_sizes(options, *episode_tokens(settings, load_profile(backend).frame_spec))
    return EngineConfig(
        model_path=settings.model_path or "",
        dtype=settings.dtype,
        tensor_parallel_size=settings.effective_tensor_parallel_size(backend),
        data_parallel_size=settings.data_parallel_size,
        max_model_len=settings.max_model_len,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        mm_encoder_attn_backend=settings.mm_encoder_attn_backend,
        mm_processor_cache_gb=settings.mm_processor_cache_gb,
        drain_s=settings.shutdown_timeout_s,
        enforce_eager=settings.enforce_eager,
        cpu_kv_cache_gib=settings.cpu_kv_cache_gib,
        max_batch_size=settings.max_batch_size,
        batch_wait_ms=settings.batch_wait_ms,
        seed=settings.seed,
        max_images=settings.max_images_per_request,
        # videos per prompt: a progress curve's clips (one per point), or an episode's camera views
        max_videos=max(settings.max_progress_points, MAX_VIEWS),
        options=options,
    )


def build_engine(settings: ServerSettings) -> Engine:
    return load_engine(settings.engine, engine_config(settings))


def build_service(
    settings: ServerSettings, on_failure: Callable[[str], None] | None = None, owns_process: bool = False
):
    """The scoring service these settings describe (engine not yet started). `owns_process`: the
    service is the process's one tenant (the CLI, a Ray Serve replica), so it may freeze the
    interpreter's start-up heap once warm (memory_release.freeze_startup_heap); a service embedded
    beside other code (tests, notebooks) leaves the collector alone."""
    from reward_server.core.service import RewardService

    settings = resolve(settings)
    return RewardService(
        settings, build_engine(settings), build_profile(settings), on_failure=on_failure, freeze_heap=owns_process
    )


def build_app_from_settings(settings: ServerSettings, on_failure: Callable[[str], None] | None = None):
    from reward_server.http.app import build_app

    return build_app(build_service(settings, on_failure))
