"""Flags toward vLLM's compute ceiling, as sugar over `--engine-option`, checked against the
installed vLLM before an engine is built.

- `--quantization fp8`: weights quantized to FP8 at load time (vLLM's dynamic FP8 for a bf16
  checkpoint); `--kv-cache-dtype fp8`: the KV cache in FP8. Both are lossy: measure the score
  fidelity against bf16 (`python -m reward_tools.fidelity`) before training on them.
- `--compile-mm-encoder` / `--cudagraph-mm-encoder`: vLLM's compilation-config switches that
  torch.compile the vision encoder and capture it in CUDA graphs (newer vLLM releases only).
  The CUDA-graph switch crashes vLLM 0.24 on Qwen2.5-VL video at the first batch: it sizes the
  graphs' frame buffers from its largest-frame video, and a batch of small 16-frame episodes holds
  more frames. With `encoder_cudagraph_max_frames_per_batch` raised in `compilation_config` it
  runs, but slower on an H200 (docs/bench/h200_2026-11-27_issue40_round4/), so no preset or
  benchmark default turns it on.

Each flag becomes the engine option vLLM's `AsyncEngineArgs` takes (`quantization`,
`kv_cache_dtype`, `compilation_config`), merged with what `--engine-option` says; giving the same
setting both ways with different values is refused. Whether the installed vLLM knows a value is
checked at engine start (`check_supported`), so the error names the version and what it offers.
"""

from __future__ import annotations

import json
import typing
from typing import Any

ENCODER_SWITCHES = ("compile_mm_encoder", "cudagraph_mm_encoder")


class UnsupportedByVllm(ValueError):
    """The installed vLLM does not offer what a flag asks for."""


def flag_options(
    quantization: str | None,
    kv_cache_dtype: str | None,
    compile_mm_encoder: bool,
    cudagraph_mm_encoder: bool,
    explicit: dict[str, str],
) -> dict[str, str]:
    """The engine options these flags stand for, merged into the explicit `--engine-option`s."""
    options = dict(explicit)
    for key, value in (("quantization", quantization), ("kv_cache_dtype", kv_cache_dtype)):
        if value is None:
            continue
        if key in explicit and explicit[key] != value:
            raise ValueError(f"--{key.replace('_', '-')} {value} and --engine-option {key}={explicit[key]} disagree")
        options[key] = value
    switches = {
        name: True
        for name, on in (("compile_mm_encoder", compile_mm_encoder), ("cudagraph_mm_encoder", cudagraph_mm_encoder))
        if on
    }
    if switches:
        compilation: dict[str, Any] = {}
        if "compilation_config" in explicit:
            try:
                compilation = json.loads(explicit["compilation_config"])
            except ValueError:
                compilation = None  # type: ignore[assignment]
            if not isinstance(compilation, dict):
                raise ValueError(
                    "--engine-option compilation_config must be a JSON object to combine with encoder flags"
                )
        compilation.update(switches)
        options["compilation_config"] = json.dumps(compilation)
    return options


def _vllm_version() -> str:
    try:
        import vllm

        return f"vLLM {vllm.__version__}"
    except Exception:  # pragma: no cover - vllm's import failing is reported by the engine
        return "this vLLM"


def check_supported(kwargs: dict[str, Any]) -> None:
    """Raise UnsupportedByVllm if the installed vLLM lacks a quantization method, KV-cache dtype or
    compilation-config switch these engine arguments ask for."""
    method = kwargs.get("quantization")
    if method is not None:
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

        if method not in QUANTIZATION_METHODS:
            raise UnsupportedByVllm(
                f"--quantization {method!r}: {_vllm_version()} knows {', '.join(sorted(QUANTIZATION_METHODS))}"
            )
    cache = kwargs.get("kv_cache_dtype")
    if cache is not None:
        from vllm.config.cache import CacheDType

        known = typing.get_args(CacheDType)
        if known and cache not in known:
            raise UnsupportedByVllm(f"--kv-cache-dtype {cache!r}: {_vllm_version()} knows {', '.join(known)}")
    compilation = kwargs.get("compilation_config")
    if isinstance(compilation, dict):
        wanted = [k for k in ENCODER_SWITCHES if compilation.get(k)]
        if wanted:
            from vllm.config import CompilationConfig

            fields = getattr(CompilationConfig, "__dataclass_fields__", None) or getattr(
                CompilationConfig, "model_fields", {}
            )
            missing = [k for k in wanted if k not in fields]
            if missing:
                raise UnsupportedByVllm(
                    f"{_vllm_version()} has no {' or '.join(missing)} in its compilation config "
                    f"(--{missing[0].replace('_', '-')} needs a newer vLLM)"
                )
