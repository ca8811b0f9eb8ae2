"""The vision tower's MLP width padded with zeros to a multiple of 64, inside vLLM's worker.

Qwen2.5-VL's vision blocks have an MLP 3420 wide, which is not a multiple of 8. Each block's down
projection multiplies activations 3420 wide, and CUDA picks a GEMM for 2-element alignment. On one
H200 (vLLM 0.24, 7B shapes, 64 episodes of 16 frames at 256x256) that kernel took 207 ms of the
vision tower's 947 ms of GPU time. The tower's other GEMMs ran 4x faster per FLOP
(docs/bench/h200_2026-11-26_issue40_round3/, `reward_tools.gpu_trace`). Padded, the encoder took
766 ms and the hook path 0.92x the time (1.97 against 2.13 s), with the same greedy answers.

The padding does not change what the MLP computes. The gate and up projections get zero rows,
their bias zero entries, so the padded channels are silu(0) * 0 = 0. The down projection gets zero
columns, so those channels add nothing. Only the GEMM shapes change, so the embeddings are the same
up to rounding (other kernels sum in another order). With tensor parallelism each worker pads its
own slice: gate and up halves stay paired per worker.

Skipped, with the reason logged: quantized layers (their weights are not plain tensors), vLLM on
CPUs (it repacks linear weights for its own GEMM), and an encoder that vLLM compiled
(`--compile-mm-encoder`): its graphs are traced with the weights' shapes, and Inductor pads
misaligned GEMMs itself, and an encoder in vLLM's CUDA graphs (`cudagraph_mm_encoder`): they are
captured before this runs, on the weights as loaded, and a replay would read the storage the padding
replaced. `--engine-option vision_mlp_align=true|false` decides; the default is on on GPUs.

Checked before it serves: each block's MLP runs on one random input before and after its padding,
and if any output differs by more than TOLERANCE of the unpadded output's largest value (rounding in
the weights' dtype is far below it; a layout that is not [gate; up] is far above it), every block
gets its unpadded weights back and the worker says why.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

OPTION = "vision_mlp_align"
METHOD = "reward_align_vision_mlp"
MULTIPLE = 64  # a whole number of the GEMMs' 64-wide K tiles; 3420 -> 3456 costs 1% more FLOPs

_FLOAT_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")
TOLERANCE = 1e-2  # of the unpadded output's largest magnitude
_CHECK_ROWS = 8


def _plain(layer: Any) -> bool:
    """A vLLM linear layer whose weight is an ordinary float tensor (not quantized)."""
    method = type(getattr(layer, "quant_method", None)).__name__
    weight = getattr(layer, "weight", None)
    return method == "UnquantizedLinearMethod" and weight is not None and str(weight.dtype) in _FLOAT_DTYPES


def pad_mlp(gate_up: Any, down: Any, multiple: int = MULTIPLE) -> bool:
    """Pad one MLP (a merged [gate; up] projection and a down projection) to a multiple of
    `multiple` wide with zeros; False when it was aligned already or is not of that form."""
    import torch

    width = down.weight.shape[1]
    if gate_up.weight.shape[0] != 2 * width:
        return False
    padded = -(-width // multiple) * multiple
    if padded == width:
        return False
    with torch.no_grad():
        weight = gate_up.weight
        grown = weight.new_zeros((2 * padded, weight.shape[1]))
        grown[:width] = weight[:width]
        grown[padded : padded + width] = weight[width:]
        gate_up.weight.data = grown
        if gate_up.bias is not None:
            bias = gate_up.bias
            grown_bias = bias.new_zeros(2 * padded)
            grown_bias[:width] = bias[:width]
            grown_bias[padded : padded + width] = bias[width:]
            gate_up.bias.data = grown_bias
        weight = down.weight
        grown = weight.new_zeros((weight.shape[0], padded))
        grown[:, :width] = weight
        down.weight.data = grown
    return True


def _weights(gate_up: Any, down: Any) -> tuple:
    """The tensors padding replaces, to put back if its check fails."""
    bias = gate_up.bias.data if gate_up.bias is not None else None
    return gate_up.weight.data, bias, down.weight.data


def _restore(gate_up: Any, down: Any, saved: tuple) -> None:
    weight, bias, down_weight = saved
    gate_up.weight.data = weight
    if bias is not None:
        gate_up.bias.data = bias
    down.weight.data = down_weight


def _mlp_output(mlp: Any, x: Any) -> Any:
    out = mlp(x)
    return out[0] if isinstance(out, tuple) else out  # vLLM's linear layers may answer (out, bias)


def align_vision_mlps(model: Any, multiple: int = MULTIPLE, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Pad the MLPs of `model.visual.blocks`, each checked against its unpadded self on one random
    input (all put back if one differs by more than `tolerance`); what was done, for the log."""
    import torch

    blocks = getattr(getattr(model, "visual", None), "blocks", None)
    if blocks is None:
        return {"padded": 0, "skipped": "the model has no vision blocks (model.visual.blocks)"}
    padded, widths = 0, set()
    for block in blocks:
        mlp = getattr(block, "mlp", None)
        gate_up, down = getattr(mlp, "gate_up_proj", None), getattr(mlp, "down_proj", None)
        if gate_up is None or down is None:
            return {"padded": padded, "skipped": "a vision block's MLP is not a merged gate/up + down projection"}
        if not (_plain(gate_up) and _plain(down)):
            return {"padded": padded, "skipped": "the vision MLP is quantized"}
        if hasattr(down, "cpu_linear") or down.weight.ndim != 2 or gate_up.weight.ndim != 2:
            # vLLM's CPU platform repacks linear weights for its own GEMM and drops the originals
            return {"padded": padded, "skipped": "this platform repacked the linear weights (vLLM on CPUs)"}
    saved, worst = [], 0.0
    generator = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for block in blocks:
            mlp = block.mlp
            gate_up, down = mlp.gate_up_proj, mlp.down_proj
            before = down.weight.shape[1]
            x = torch.randn(_CHECK_ROWS, gate_up.weight.shape[1], generator=generator)
            x = x.to(device=gate_up.weight.device, dtype=gate_up.weight.dtype)
            reference = _mlp_output(mlp, x).float()
            weights = _weights(gate_up, down)
            if not pad_mlp(gate_up, down, multiple):
                continue
            saved.append((gate_up, down, weights))
            widths.add((before, down.weight.shape[1]))
            padded += 1
            scale = float(reference.abs().max()) or 1.0
            worst = max(worst, float((_mlp_output(mlp, x).float() - reference).abs().max()) / scale)
            if worst > tolerance:
                for layers in saved:
                    _restore(*layers)
                return {
                    "padded": 0,
                    "skipped": f"a padded MLP differs from its unpadded self by {worst:.3g} of its largest output "
                    f"(tolerance {tolerance:g}): put back unpadded",
                }
    return {"padded": padded, "widths": sorted(widths), "checked": round(worst, 6)}


class VisionMlpAlignment:
    """vLLM's worker extension: the method the engine calls once after start."""

    def reward_align_vision_mlp(self) -> dict[str, Any]:
        runner = getattr(self, "model_runner", None)
        compilation = getattr(getattr(runner, "vllm_config", None), "compilation_config", None)
        if getattr(compilation, "compile_mm_encoder", False):
            return {"padded": 0, "skipped": "the vision encoder is compiled (Inductor aligns its GEMMs)"}
        if getattr(compilation, "cudagraph_mm_encoder", False):
            # the graphs were captured at start, before this call, on the weights' storage: new
            # tensors now would leave every replay reading the old, freed storage
            return {"padded": 0, "skipped": "the vision encoder runs in CUDA graphs captured on its unpadded weights"}
        model = runner.get_model() if runner is not None and hasattr(runner, "get_model") else None
        done = align_vision_mlps(model)
        if done.get("skipped"):
            logger.warning("vision MLP alignment: %s; left as it is", done["skipped"])
        return done
