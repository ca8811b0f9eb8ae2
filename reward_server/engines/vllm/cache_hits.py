"""A request whose every image and video is a processor-cache hit calls no HF processor, on vLLMs
that call it anyway.

With its multimodal processor cache on, vLLM processes only a request's items it has not seen
(by id: vllm_curves). vLLM 0.24 still calls the checkpoint's HF processor when none is left: for
Qwen2.5-VL, whose processor class overrides the call, `_apply_hf_processor_mm_only` runs it on a
dummy text and no media, and every output of that call is dropped (the text's ids are popped, no
field of the model's is in it). vLLM 0.32 skips the call when there is nothing to process. A
16-point progress curve has seven such points (the ones ending on a whole frame pair: their clips
are all the longest point's); on one H200 host they took 10.3 of the 52.8 ms a curve's input
processing took on one thread (reward_tools/benchmarks/input_processing.py --points 16, issue 40's twelfth
round), each a whole processor call: transformers merging and validating its keyword arguments,
the tokenizer on the dummy text.

Here `_apply_hf_processor_mm_only` answers an empty BatchFeature when it gets no item, what the
dropped call would have contributed, and calls the processor as before otherwise. On another H200
host, one thread, the same episodes both ways: 41.4 ms a curve against 44.8 ms (the all-hit points
4.4 against 9.1 ms), and every engine input the same (`bench_input_processing.py --ab skip,call`:
token ids, placeholders, every tensor's bytes; docs/bench/h200_2026-11-29_issue40_round12/).
Installed once per process, in the server's (the front end processes inputs; the engine core does
not). Where vLLM has no such method (0.32 and later) nothing is changed. `--engine-option
skip_cached_hf_call=false` leaves vLLM as it is.
"""

from __future__ import annotations

import functools
from typing import Any

OPTION = "skip_cached_hf_call"
METHOD = "_apply_hf_processor_mm_only"
_MARK = "_reward_skips_empty"


def _vllm_processor() -> Any:
    from vllm.multimodal.processing.processor import BaseMultiModalProcessor

    return BaseMultiModalProcessor


def install(processor_cls: Any = None) -> str:
    """Wrap vLLM's `_apply_hf_processor_mm_only` (on `processor_cls`, vLLM's
    BaseMultiModalProcessor by default) to skip the HF processor when no item is left; what was
    done, for the log."""
    processor_cls = processor_cls or _vllm_processor()
    original = getattr(processor_cls, METHOD, None)
    if original is None:
        return "vLLM calls no HF processor for a request whose items are all cached: nothing to change"
    if getattr(original, _MARK, False):
        return "HF processor skipped for requests whose items are all cached (already)"

    @functools.wraps(original)
    def skip_when_empty(self: Any, mm_items: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(mm_items.get_all_counts().values()):
            from transformers import BatchFeature

            return BatchFeature()
        return original(self, mm_items, *args, **kwargs)

    setattr(skip_when_empty, _MARK, True)
    setattr(processor_cls, METHOD, skip_when_empty)
    return "HF processor skipped for requests whose items are all cached"


def installed(processor_cls: Any = None) -> bool:
    """Whether the skip is in place (False where this vLLM has no such method: nothing to skip)."""
    current = getattr(processor_cls or _vllm_processor(), METHOD, None)
    return bool(getattr(current, _MARK, False))


def uninstall(processor_cls: Any = None) -> None:
    """Undo install (for comparing both ways in one process)."""
    processor_cls = processor_cls or _vllm_processor()
    current = getattr(processor_cls, METHOD, None)
    if current is not None and getattr(current, _MARK, False):
        setattr(processor_cls, METHOD, current.__wrapped__)
