"""engines/vllm/pixel_norm.py: uint8 patches normalized in the vision tower give the processor's own
float32 patches bit for bit. Checked on the tiny checkpoint's real HF processor, and on a torch
module standing in for vLLM's vision tower (only its forward's first argument matters to the
wrapper); the real vLLM path is tests/engine/test_pixel_norm.py."""

from __future__ import annotations

import types

import numpy as np
import pytest

from reward_server.engines.vllm.pixel_norm import (
    RAW_PIXELS,
    check_exact,
    normalize,
    processor_constants,
    wrap_vision_tower,
)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def processor(tiny_checkpoint):
    from reward_server.engines.prompting import load_processor

    return load_processor(tiny_checkpoint)


def test_the_processors_constants_reproduce_its_patches_exactly(processor):
    constants = processor_constants(processor)
    assert not isinstance(constants, str), constants
    assert check_exact(processor, constants) is None
    video = np.random.default_rng(1).integers(0, 256, (6, 112, 84, 3), dtype=np.uint8)
    reference = processor.video_processor(videos=[video], return_tensors="pt")["pixel_values_videos"]
    raw = processor.video_processor(videos=[video], return_tensors="pt", **RAW_PIXELS)["pixel_values_videos"]
    assert raw.dtype == torch.uint8 and raw.shape == reference.shape
    assert torch.equal(normalize(raw, constants), reference)


def test_other_constants_are_caught_by_the_check(processor):
    sub, div = processor_constants(processor)
    off_by_one_ulp = ([float(np.nextafter(np.float32(sub[0]), np.float32(0))), *sub[1:]], div)
    assert "differ from the processor's" in check_exact(processor, off_by_one_ulp)


def test_a_processor_that_does_not_normalize_is_refused(processor):
    image = types.SimpleNamespace(do_rescale=True, do_normalize=False)
    assert "does not both rescale and normalize" in processor_constants(types.SimpleNamespace(image_processor=image))
    video = processor.video_processor
    halves = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    other = types.SimpleNamespace(do_rescale=True, do_normalize=True, rescale_factor=video.rescale_factor, **halves)
    both = types.SimpleNamespace(image_processor=other, video_processor=video)
    assert "different constants" in processor_constants(both)


class _Tower(torch.nn.Module):
    """What the wrapper sees of vLLM's vision tower: a device and forward(x, grid_thw)."""

    device = torch.device("cpu")

    def forward(self, x, grid_thw):
        return x.to(torch.bfloat16), grid_thw


def test_the_wrapped_tower_normalizes_uint8_and_passes_floats_through(processor):
    constants = processor_constants(processor)
    model = types.SimpleNamespace(visual=_Tower())
    assert wrap_vision_tower(model, constants) == {"wrapped": True}
    assert wrap_vision_tower(model, constants) == {"wrapped": True}  # once: not normalized twice
    raw = torch.randint(0, 256, (4, 3 * 392), dtype=torch.uint8)
    out, grid = model.visual(raw, [[1, 2, 2]])
    assert grid == [[1, 2, 2]]
    assert torch.equal(out, normalize(raw, constants).to(torch.bfloat16))
    floats = torch.randn(4, 3 * 392)
    assert torch.equal(model.visual(floats, None)[0], floats.to(torch.bfloat16))


def test_a_tower_that_normalizes_itself_is_left_alone(processor):
    tower = _Tower()
    tower.input_norm = types.SimpleNamespace(input_dtype=torch.uint8)  # vLLM 0.32's own, switched on
    done = wrap_vision_tower(types.SimpleNamespace(visual=tower), processor_constants(processor))
    assert done["wrapped"] is False and "itself" in done["skipped"]
    assert wrap_vision_tower(types.SimpleNamespace(), ([0.0], [1.0]))["wrapped"] is False


class _GraphedModel:
    """Stands in for a vLLM model whose encoder runs in CUDA graphs (a GPU-only path): the replay
    copies what `prepare_encoder_cudagraph_replay_buffers` hands over into its buffer of the
    model's dtype, without calling the tower's forward (vLLM 0.24's EncoderCudaGraphManager)."""

    def __init__(self):
        self.visual = _Tower()
        self.buffer = torch.zeros(8, 3 * 392, dtype=torch.bfloat16)

    def prepare_encoder_cudagraph_replay_buffers(self, mm_kwargs, max_batch_size, max_frames, path="default"):
        return types.SimpleNamespace(values={"pixel_values": mm_kwargs["pixel_values_videos"], "cu_seqlens": None})

    def replay(self, mm_kwargs):
        values = self.prepare_encoder_cudagraph_replay_buffers(mm_kwargs, 8, 64).values
        x = values["pixel_values"]
        self.buffer.zero_()
        self.buffer[: x.shape[0]].copy_(x)  # vLLM's padding copy into the captured buffer
        return self.buffer[: x.shape[0]]


def test_graph_replays_get_the_numbers_the_towers_own_call_gets(processor):
    constants = processor_constants(processor)
    model = _GraphedModel()
    assert wrap_vision_tower(model, constants) == {"wrapped": True, "graph_replays": True}
    raw = torch.randint(0, 256, (4, 3 * 392), dtype=torch.uint8)
    replayed = model.replay({"pixel_values_videos": raw})
    assert torch.equal(replayed, model.visual(raw, None)[0])  # the eager path, through the tower
    assert torch.equal(replayed, normalize(raw, constants).to(torch.bfloat16))
    floats = torch.randn(4, 3 * 392)  # a processor that normalized already: passed through
    assert torch.equal(model.replay({"pixel_values_videos": floats}), floats.to(torch.bfloat16))
