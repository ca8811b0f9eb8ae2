"""Pixels leave the server's process as bytes and are normalized on the GPU, for vLLMs that do not do
this themselves.

The checkpoint's HF processor rescales and normalizes Qwen2.5-VL's pixel patches to float32 in the
server's process: 12 MB for an episode of 16 frames at 252x252. That float32 then crosses to vLLM's
engine core (ZMQ). There each step's items are concatenated on the CPU into one pinned buffer, and
only then go to the GPU. On one H200 (vLLM 0.24, 64 episodes, the compiled encoder) the trace of one
batch shows the GPU idle for 62, 49 and 45 ms while the engine core concatenated float32 pixels
(`reward_tools.gpu_trace`, issue 40). With uint8 patches every one of those copies is 4x smaller,
and the processor skips its float32 pass.

How: each prompt asks the processor for unnormalized patches (`mm_processor_kwargs`
{do_rescale: false, do_normalize: false}: uint8, in the same patch layout). The vision tower's
forward in vLLM's worker is wrapped so that a uint8 input is normalized there, in float32, with the
processor's own formula and constants: (x - mean / rescale) / (std / rescale), what
transformers' fast processors compute. The tower then casts it to the model's dtype as before, so
it receives the same numbers. The engine checks that claim once at start on the CPU
(`check_exact`: a probe video and image through the processor both ways, compared bit for bit);
if it fails, or the image and video processors disagree on their constants, this stays off with
the reason logged. Skipped in the worker, with the reason, when vLLM's tower normalizes uint8 itself.
Where vLLM runs the encoder in CUDA graphs (`cudagraph_mm_encoder`), a replay copies the pixels into
its captured buffer without calling the tower's forward; the model's
`prepare_encoder_cudagraph_replay_buffers`, which hands those pixels over, is wrapped the same way,
so a replay receives the same numbers as the tower's own call.

Measured on H200s (vLLM 0.24, 7B shapes, 64 episodes of 16 frames at 256x256; the hook path,
docs/bench/h200_2026-11-27_issue40_round4/, rows side by side on one machine): input processing
per episode 72-85 -> 39-44 ms (mean); K = 1 2.10 -> 1.94 s with the defaults (`m4`), and with
`--compile-mm-encoder` 1.82 -> 1.74 s (`m2`, median of two rounds of 5); curves with the compiled
encoder 1.76 / 3.16 / 6.45 -> 1.72 / 2.87 / 5.73 s (K = 1 / 8 / 16); PRIMO-R1 unchanged. Greedy
answers of 64 episodes: 64 (compiled) and 63 (defaults) of 64 the same. So it is on by default on
GPUs; `--engine-option normalize_on_device=false` turns it off.

vLLM 0.32 and later do the same themselves (`mm_device_do_normalize`, on by default for the models
that support it). There this module steps aside: it runs only where vLLM has no such switch, or
the user turned vLLM's off.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)
# vLLM's worker processes configure only vLLM's loggers: a child of "vllm" is what reaches their log
worker_logger = logging.getLogger(f"vllm.{__name__}")

OPTION = "normalize_on_device"
METHOD = "reward_normalize_on_device"
VLLM_SWITCH = "mm_device_do_normalize"  # vLLM's own, where it has one
RAW_PIXELS = {"do_rescale": False, "do_normalize": False}  # the processor's patches as uint8

_MARK = "_reward_normalizes"
FIRST_SEEN = "_reward_normalized_once"
FIRST_LOG = "pixels normalized in the vision tower"
Constants = tuple[list[float], list[float]]  # per channel: what to subtract, what to divide by


def processor_constants(processor: Any) -> Constants | str:
    """The per-channel (subtrahend, divisor) the processor's float32 normalization uses, or why
    there are none to use: both its image and video processors must rescale and normalize with
    the same constants (the vision tower cannot tell an image's patches from a video's)."""
    import torch

    found = []
    for name in ("image_processor", "video_processor"):
        part = getattr(processor, name, None)
        if part is None:
            continue
        if not (getattr(part, "do_rescale", False) and getattr(part, "do_normalize", False)):
            return f"the {name} does not both rescale and normalize"
        scale = 1.0 / float(part.rescale_factor)
        # as transformers' fast processors fuse them: float32 tensors times the scale
        sub = (torch.tensor(part.image_mean, dtype=torch.float32) * scale).tolist()
        div = (torch.tensor(part.image_std, dtype=torch.float32) * scale).tolist()
        found.append((sub, div))
    if not found:
        return "the processor has no image or video processor"
    if any(f != found[0] for f in found[1:]):
        return "the image and video processors normalize with different constants"
    return found[0]


class Normalization:
    """The constants as float32 tensors on one device, made once: a tensor built from a Python list
    on the GPU is a synchronous copy, which the vision tower's calls should not wait for."""

    def __init__(self, constants: Constants, device: Any = "cpu"):
        import torch

        sub, div = constants
        self.channels = len(sub)
        self.sub = torch.tensor(sub, dtype=torch.float32, device=device).view(1, self.channels, 1)
        self.div = torch.tensor(div, dtype=torch.float32, device=device).view(1, self.channels, 1)

    def __call__(self, patches: Any) -> Any:
        """uint8 patches (patches, channels * rest) on this device, channel-major as Qwen2-VL's
        processors flatten them, as the processor's float32 output: (x - sub[c]) / div[c]."""
        import torch

        rows, width = patches.shape
        x = patches.reshape(rows, self.channels, width // self.channels).to(torch.float32)
        return ((x - self.sub) / self.div).reshape(rows, width)


def normalize(patches: Any, constants: Constants) -> Any:
    """`Normalization` of `patches` on their own device, for one call."""
    return Normalization(constants, patches.device)(patches)


def check_exact(processor: Any, constants: Constants) -> str | None:
    """None when `normalize` of the processor's uint8 patches equals its own float32 patches bit for
    bit, on a probe video and image; else what differed."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    probes = []
    if getattr(processor, "video_processor", None) is not None:
        video = rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8)
        probes.append(("video", processor.video_processor, {"videos": [video]}, "pixel_values_videos"))
    if getattr(processor, "image_processor", None) is not None:
        image = rng.integers(0, 256, (84, 56, 3), dtype=np.uint8)
        probes.append(("image", processor.image_processor, {"images": [image]}, "pixel_values"))
    for name, part, data, key in probes:
        reference = part(**data, return_tensors="pt")[key]
        raw = part(**data, return_tensors="pt", **RAW_PIXELS)[key]
        if raw.dtype != torch.uint8:
            return f"the {name} processor gave {raw.dtype} patches, not uint8, without normalizing"
        ours = normalize(raw, constants)
        if not torch.equal(ours, reference):
            return f"{name} patches differ from the processor's by up to {(ours - reference).abs().max().item():.3g}"
    return None


def wrap_vision_tower(model: Any, constants: Constants) -> dict[str, Any]:
    """Make `model.visual` normalize uint8 inputs before its own forward; what was done, for the log."""
    visual = getattr(model, "visual", None)
    if visual is None:
        return {"wrapped": False, "skipped": "the model has no vision tower (model.visual)"}
    native = getattr(getattr(visual, "input_norm", None), "input_dtype", None)
    if str(native) == "torch.uint8":
        return {"wrapped": False, "skipped": "vLLM normalizes uint8 pixels on the device itself"}
    if getattr(visual, _MARK, False):
        return {"wrapped": True}
    original = visual.forward
    normalization = Normalization(constants, visual.device)

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(x, "dtype", None) is not None and str(x.dtype) == "torch.uint8":
            if not getattr(visual, FIRST_SEEN, False):  # once: the prompts' uint8 patches do arrive
                setattr(visual, FIRST_SEEN, True)
                worker_logger.info("%s: %d uint8 patches, the first", FIRST_LOG, x.shape[0])
            x = normalization(x.to(device=visual.device))
        return original(x, *args, **kwargs)

    visual.forward = forward
    setattr(visual, _MARK, True)
    replays = _wrap_graph_replays(model, normalization)
    return {"wrapped": True, **({"graph_replays": True} if replays else {})}


def _wrap_graph_replays(model: Any, normalization: Normalization) -> bool:
    """Normalize the uint8 pixels the model hands to its encoder's CUDA-graph replays (vLLM's
    `prepare_encoder_cudagraph_replay_buffers`, where it has one); False where it has none."""
    original = getattr(model, "prepare_encoder_cudagraph_replay_buffers", None)
    if original is None:
        return False

    def prepare(*args: Any, **kwargs: Any) -> Any:
        replay = original(*args, **kwargs)
        values = getattr(replay, "values", None)
        x = values.get("pixel_values") if isinstance(values, dict) else None
        if x is not None and str(x.dtype) == "torch.uint8":
            if not getattr(model, FIRST_SEEN, False):  # once: the log shows the replays get uint8
                setattr(model, FIRST_SEEN, True)
                worker_logger.info("%s for a graph replay: %d uint8 patches, the first", FIRST_LOG, x.shape[0])
            # the replay copies this into its buffer of the model's dtype: the cast the tower makes
            values["pixel_values"] = normalization(x.to(device=normalization.sub.device))
        return replay

    model.prepare_encoder_cudagraph_replay_buffers = prepare
    return True


class PixelNormalization:
    """vLLM's worker extension: the method the engine calls once after start."""

    def reward_normalize_on_device(self, sub: list[float], div: list[float]) -> dict[str, Any]:
        runner = getattr(self, "model_runner", None)
        model = runner.get_model() if runner is not None and hasattr(runner, "get_model") else None
        done = wrap_vision_tower(model, (sub, div))
        if done.get("skipped"):
            worker_logger.warning("pixel normalization on the device: %s; left as it is", done["skipped"])
        return done
