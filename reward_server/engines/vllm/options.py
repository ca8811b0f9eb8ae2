"""Flags toward vLLM's compute ceiling, as sugar over `--engine-option`, checked against the
installed vLLM before an engine is built.

- `--quantization fp8`: weights quantized to FP8 at load time (vLLM's dynamic FP8 for a bf16
  checkpoint); `--kv-cache-dtype fp8`: the KV cache in FP8. Both are lossy: measure the score
  fidelity against bf16 (`python -m reward_tools.fidelity`) before training on them.
- `--compile-mm-encoder` / `--cudagraph-mm-encoder`: vLLM's compilation-config switches that
  torch.compile the vision encoder and capture it in CUDA graphs (newer vLLM releases only).
  vLLM sizes the encoder's graphs from the model's largest input: power-of-two token budgets and,
  for video, frame buffers for its longest video. Our episodes are short videos of one size: vLLM
  0.24 crashed on a step of more 16-frame episodes than those buffers held, and with them raised
  every step ran padded to the next power of two, slower (an H200, docs/bench/
  h200_2026-11-27_issue40_round4/). So where the compilation config names none of the graphs'
  sizes, `--cudagraph-mm-encoder` captures them at the server's episode, the warm-up's
  (`--warmup-frames`, `--warmup-size`): budgets of 1 to 8 episodes' tokens, 8 items and their
  time slices a graph (`encoder_graph_sizes`). vLLM packs a step's items into as few replays as
  fit, so a step of whole episodes runs unpadded. With `--compile-mm-encoder`, on two H200s, four
  servers a side, the hook path's K = 1 took 1.580-1.596 s with the graphs against 1.576-1.625 s
  without, its front (before the GPU's first step) half as long, and 63 of 64 greedy answers were
  the same (docs/bench/h200_2026-11-29_issue40_round13/).
- Both encoder switches are on by default where vLLM runs on CUDA GPUs (`ServerSettings.
  encoder_switches`; `--no-compile-mm-encoder`, `--no-cudagraph-mm-encoder` turn each off), off on
  CPU and with `--enforce-eager`. Why: one H200, vLLM 0.24, 64 episodes on the hook path, 5 repeats
  (`profile_gpu.sh ab`): 1.87 s (1.82-1.88) without them, 1.62 s (1.61-1.67) with them. What they
  cost: the graphs hold ~1.2 GiB of GPU memory the KV cache then lacks (1.67 against 0.46 GiB), and
  progress curves K = 16 took 5.01 s against 4.78 s on the one pair measured with and without the
  graphs (round 13): a server that scores mostly long curves may measure `--no-cudagraph-mm-encoder`.

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
# vLLM's names for the encoder graphs' sizes; any one given and we fill in none
GRAPH_SIZES = (
    "encoder_cudagraph_token_budgets",
    "encoder_cudagraph_max_vision_items_per_batch",
    "encoder_cudagraph_max_frames_per_batch",
)
GRAPH_EPISODES = 8  # episodes one encoder graph holds: a step's first replays, then 8 at a time


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
        compilation = _compilation(explicit) if "compilation_config" in explicit else {}
        if compilation is None:
            raise ValueError("--engine-option compilation_config must be a JSON object to combine with encoder flags")
        compilation.update(switches)
        options["compilation_config"] = json.dumps(compilation)
    return options


def _compilation(options: dict[str, str]) -> dict[str, Any] | None:
    """`--engine-option compilation_config` as a dict; None when absent or not a JSON object."""
    try:
        compilation = json.loads(options.get("compilation_config", "null"))
    except ValueError:
        return None
    return compilation if isinstance(compilation, dict) else None


def encoder_graph_sizes(tokens: int, time_slices: int, episodes: int = GRAPH_EPISODES) -> dict[str, Any]:
    """vLLM's encoder-graph sizes for items of `tokens` merged tokens in `time_slices` slices each:
    a budget per whole number of them up to `episodes`, as many items a graph (vLLM needs no more
    items than its smallest budget's tokens) and their slices (one attention sequence each)."""
    if tokens < 1 or time_slices < 1:
        raise ValueError(f"an episode of {tokens} tokens in {time_slices} time slices has no encoder graph size")
    items = min(episodes, tokens)
    return {
        "encoder_cudagraph_token_budgets": [k * tokens for k in range(1, items + 1)],
        "encoder_cudagraph_max_vision_items_per_batch": items,
        "encoder_cudagraph_max_frames_per_batch": items * time_slices,
    }


def with_encoder_graph_sizes(options: dict[str, str], tokens: int, time_slices: int) -> dict[str, str]:
    """`options` with the encoder graphs sized for one episode shape (`encoder_graph_sizes`) where
    `compilation_config` turns them on and names none of their sizes; else as they are."""
    compilation = _compilation(options)  # not a JSON object: vLLM refuses it at engine start
    if compilation is None or not compilation.get("cudagraph_mm_encoder"):
        return options
    if any(name in compilation for name in GRAPH_SIZES):
        return options
    compilation.update(encoder_graph_sizes(tokens, time_slices))
    return {**options, "compilation_config": json.dumps(compilation)}


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
                    f"(--{missing[0].replace('_', '-')} needs a newer vLLM; on GPUs it is on unless "
                    f"--no-{missing[0].replace('_', '-')} turns it off)"
                )
