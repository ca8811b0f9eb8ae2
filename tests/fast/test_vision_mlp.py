"""engines/vllm/vision_mlp.py: padding a vision MLP to an aligned width changes its GEMM shapes,
not what it computes. Checked here on torch layers laid out as vLLM's (a merged [gate; up]
projection with bias, a down projection), in float64 where the two must agree exactly; the real
vLLM path is tests/engine/test_vision_mlp_align.py."""

from __future__ import annotations

import types

import pytest

from reward_server.engines.vllm.vision_mlp import align_vision_mlps, pad_mlp

torch = pytest.importorskip("torch")


def _mlp(hidden: int, width: int, bias: bool = True):
    torch.manual_seed(0)
    gate_up = torch.nn.Linear(hidden, 2 * width, bias=bias, dtype=torch.float64)
    down = torch.nn.Linear(width, hidden, bias=bias, dtype=torch.float64)
    return gate_up, down


def _forward(gate_up, down, x):
    gated = gate_up(x)
    d = gated.shape[-1] // 2  # vLLM's SiluAndMul
    return down(torch.nn.functional.silu(gated[..., :d]) * gated[..., d:])


@pytest.mark.parametrize("bias", [True, False])
def test_padding_keeps_the_output_and_aligns_the_width(bias):
    gate_up, down = _mlp(hidden=40, width=100, bias=bias)  # 100 is not a multiple of 64
    x = torch.randn(7, 40, dtype=torch.float64)
    before = _forward(gate_up, down, x)
    assert pad_mlp(gate_up, down)
    assert gate_up.weight.shape == (256, 40) and down.weight.shape == (40, 128)
    after = _forward(gate_up, down, x)
    assert torch.allclose(after, before, rtol=1e-12, atol=1e-12)  # the same sums, added in another order
    assert not pad_mlp(gate_up, down)  # aligned now: left alone


def test_an_aligned_or_unpaired_mlp_is_left_alone():
    gate_up, down = _mlp(hidden=40, width=128)
    assert not pad_mlp(gate_up, down) and down.weight.shape == (40, 128)
    gate_up = torch.nn.Linear(40, 100, dtype=torch.float64)  # not a [gate; up] pair for this width
    assert not pad_mlp(gate_up, torch.nn.Linear(100, 40, dtype=torch.float64))


def test_a_model_without_vision_blocks_is_named():
    done = align_vision_mlps(torch.nn.Linear(2, 2))
    assert done["padded"] == 0 and "no vision blocks" in done["skipped"]


def test_each_tensor_parallel_slice_padded_on_its_own_sums_to_the_same():
    """With tensor parallelism each worker holds [gate slice; up slice] and the matching columns of
    the down projection, and pads its own slice; the all-reduced sum is the unpadded MLP's output."""
    hidden, width, ranks = 40, 100, 2
    gate_up, down = _mlp(hidden, width, bias=False)
    x = torch.randn(5, hidden, dtype=torch.float64)
    whole = _forward(gate_up, down, x)
    share = width // ranks
    total = torch.zeros_like(whole)
    for rank in range(ranks):
        cols = slice(rank * share, (rank + 1) * share)
        local_gate_up = torch.nn.Linear(hidden, 2 * share, bias=False, dtype=torch.float64)
        local_down = torch.nn.Linear(share, hidden, bias=False, dtype=torch.float64)
        with torch.no_grad():  # vLLM's MergedColumnParallelLinear / RowParallelLinear layout
            local_gate_up.weight.copy_(torch.cat([gate_up.weight[:width][cols], gate_up.weight[width:][cols]]))
            local_down.weight.copy_(down.weight[:, cols])
        assert pad_mlp(local_gate_up, local_down) and local_down.weight.shape == (hidden, 64)
        total += _forward(local_gate_up, local_down, x)
    assert torch.allclose(total, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("switch", "why"), [("compile_mm_encoder", "compiled"), ("cudagraph_mm_encoder", "CUDA graphs")]
)
def test_an_encoder_vllm_compiled_or_captured_is_left_unpadded(switch, why):
    """Graphs are captured at engine start on the weights as loaded; padding after that would leave
    their replays reading the storage the padding replaced, so the worker refuses and says why."""
    from vllm.config import CompilationConfig

    from reward_server.engines.vllm.vision_mlp import VisionMlpAlignment

    gate_up, down = _mlp(hidden=40, width=100)
    block = types.SimpleNamespace(mlp=types.SimpleNamespace(gate_up_proj=gate_up, down_proj=down))
    model = types.SimpleNamespace(visual=types.SimpleNamespace(blocks=[block]))
    config = types.SimpleNamespace(compilation_config=CompilationConfig(**{switch: True}))
    worker = VisionMlpAlignment()
    worker.model_runner = types.SimpleNamespace(vllm_config=config, get_model=lambda: model)
    done = worker.reward_align_vision_mlp()
    assert done["padded"] == 0 and why in done["skipped"]
    assert down.weight.shape == (40, 100)
