"""Pixels cast to the model's dtype in the server's process (engines/vllm/pixel_dtype.py), on vLLM's
own processed-input classes, built the way its Qwen2.5-VL processor builds them: only pixel tensors
change, to exactly what the vision tower's own cast on the GPU gives; timing and grids stay."""

from __future__ import annotations

import torch
from transformers import BatchFeature
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems

from reward_server.engines.vllm.pixel_dtype import cast_pixels


def _engine_input(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    hf = BatchFeature(
        {
            # two clips of 8 and 4 patches (Qwen2.5-VL's patch: 3 x 2 x 14 x 14 = 1176 values)
            "pixel_values_videos": torch.randn(12, 1176, generator=g),
            "video_grid_thw": torch.tensor([[2, 2, 2], [1, 2, 2]]),
            "second_per_grid_ts": torch.tensor([0.5 + 1 / 3, 1.0]),
            "pixel_values": torch.randn(4, 1176, generator=g),
            "image_grid_thw": torch.tensor([[1, 2, 2]]),
        }
    )
    config = {
        "pixel_values_videos": MultiModalFieldConfig.flat_from_sizes("video", torch.tensor([8, 4])),
        "video_grid_thw": MultiModalFieldConfig.batched("video"),
        "second_per_grid_ts": MultiModalFieldConfig.batched("video"),
        "pixel_values": MultiModalFieldConfig.flat_from_sizes("image", torch.tensor([4])),
        "image_grid_thw": MultiModalFieldConfig.batched("image"),
    }
    return {"prompt_token_ids": [1, 2, 3], "mm_kwargs": MultiModalKwargsItems.from_hf_inputs(hf, config)}


def _data(engine_input: dict) -> dict[tuple[str, int, str], torch.Tensor]:
    return {
        (modality, i, key): elem.data
        for modality, items in engine_input["mm_kwargs"].items()
        for i, item in enumerate(items)
        for key, elem in item.items()
    }


def test_only_pixels_are_cast_and_to_what_the_vision_tower_would_make_of_them():
    before = _data(_engine_input())
    engine_input = _engine_input()
    assert cast_pixels(engine_input, torch.bfloat16) == 3  # two clips and one image
    after = _data(engine_input)
    assert after.keys() == before.keys()
    for key, old in before.items():
        new = after[key]
        if key[2].startswith("pixel_values"):
            assert new.dtype == torch.bfloat16 and new.shape == old.shape
            assert torch.equal(new, old.to(torch.bfloat16))  # what x.to(dtype) makes of the float32
        else:  # clip timing (rotary positions) and grids: untouched, float32 timing included
            assert new.dtype == old.dtype and torch.equal(new, old)
    assert cast_pixels(engine_input, torch.bfloat16) == 0  # a second pass finds nothing to do


def test_nothing_is_cast_for_a_32_bit_model_or_items_the_cache_left_empty():
    engine_input = _engine_input()
    assert cast_pixels(engine_input, torch.float32) == 0
    assert all(t.dtype != torch.bfloat16 for t in _data(engine_input).values())
    cached = _engine_input()
    for items in cached["mm_kwargs"].values():
        for item in items:
            for elem in item.values():
                elem.data = None  # vLLM sends an item the engine core already holds without data
    assert cast_pixels(cached, torch.bfloat16) == 0
    assert cast_pixels({"prompt_token_ids": [1]}, torch.bfloat16) == 0  # a text-only prompt
