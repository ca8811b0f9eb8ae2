"""Pixels in the model's dtype before they leave the server's process, not after.

vLLM's processor (the checkpoint's HF processor) gives Qwen2.5-VL's pixels as float32: 12 MB for
an episode of 16 frames at 252x252. The server's process sends them to the engine core (ZMQ), the
engine core concatenates a step's items on the CPU (one buffer, pinned for the copy) and copies it
to the GPU, where the vision tower's first line casts it to the model's dtype
(`x.to(device, dtype)`). On one H200 with 64 episodes a batch, that concatenation alone took
0.3 s of the engine core's CPU per batch (py-spy, issue 40).

Casting the pixels to the model's 16-bit dtype here, in the input-processing threads, halves
every one of those copies. float32 -> bfloat16 rounds to nearest-even on the CPU as on the GPU,
so the vision tower receives the same numbers either way. Only pixel tensors are cast: Qwen2.5-VL's
`second_per_grid_ts` (the clips' timing, used for rotary positions) and the grids stay as they are.

`--engine-option pixels_in_model_dtype=true` (a 16-bit model only). Off by default: on one H200
(64 episodes, the hook path K = 1, two rounds side by side) it changed nothing measurable, 2.13 s
with it and 2.14 s without (docs/bench/h200_2026-11-26_issue40_round2/m3_ab_cast), likely
because the engine core's concatenation overlaps the GPU's previous step (not measured). What it
saves is memory and copies: half the bytes per item in vLLM's processor cache, on ZMQ and on the
way to the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPTION = "pixels_in_model_dtype"
PIXEL_KEYS = frozenset({"pixel_values", "pixel_values_videos"})


def cast_pixels(engine_input: Mapping[str, Any], dtype: Any) -> int:
    """Cast, in place, the floating-point pixel tensors of a processed vLLM input (its `mm_kwargs`:
    modality -> items -> key -> field element) to `dtype`; returns how many were cast. Items the
    processor cache left empty (data None) and non-pixel keys are left alone."""
    import torch

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return 0
    by_modality = engine_input.get("mm_kwargs") if isinstance(engine_input, Mapping) else None
    if not by_modality:
        return 0
    cast = 0
    for items in by_modality.values():
        for item in items or ():
            if item is None:
                continue
            for key, elem in item.items():
                data = getattr(elem, "data", None)
                if key not in PIXEL_KEYS or not isinstance(data, torch.Tensor):
                    continue
                if data.is_floating_point() and data.dtype != dtype:
                    elem.data = data.to(dtype)
                    cast += 1
    return cast
