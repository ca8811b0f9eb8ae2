"""Flags toward the compute ceiling (--quantization, --kv-cache-dtype, the encoder switches): sugar
over --engine-option, refused where they cannot apply, checked against the installed vLLM."""

from __future__ import annotations

import json

import pytest

from reward_server import cli
from reward_server.bootstrap import engine_config

FLAGS = ["--quantization", "fp8", "--kv-cache-dtype", "fp8", "--compile-mm-encoder", "--cudagraph-mm-encoder"]


def test_flags_become_engine_options_merged_with_explicit_ones():
    s = cli.parse_settings([*FLAGS, "--engine-option", 'compilation_config={"mode": 3}'])
    options = engine_config(s).options
    assert options["quantization"] == "fp8" and options["kv_cache_dtype"] == "fp8"
    assert json.loads(options["compilation_config"]) == {
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
