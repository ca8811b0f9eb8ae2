"""The profiler option (engines/vllm/profiler.py): what vLLM is given, and a profiler configured
twice refused on the command line with the other flags, before anything loads."""

from __future__ import annotations

import os

import pytest

from reward_server import cli
from reward_server.engines.vllm.profiler import configured, profiler_config


def test_profile_dir_becomes_vllms_profiler_for_the_engine_core_alone(tmp_path):
    config = profiler_config({"profile_dir": str(tmp_path / "t")})
    assert config == {"profiler": "torch", "torch_profiler_dir": str(tmp_path / "t"), "ignore_frontend": True}
    relative = profiler_config({"profile_dir": "traces"})
    assert relative is not None and relative["torch_profiler_dir"] == os.path.abspath("traces")
    assert profiler_config({}) is None and not configured({})
    assert configured({"profiler_config": config}) and not configured({"profiler_config": {"profiler": None}})


def test_a_profiler_configured_twice_is_refused_with_the_flags(capsys):
    argv = ["--model-path", "/m", "--engine-option", "profile_dir=/tmp/t"]
    with pytest.raises(SystemExit) as exited:
        cli.parse_settings([*argv, "--engine-option", 'profiler_config={"profiler":"torch"}'])
    assert exited.value.code == 2
    assert "profile_dir and --engine-option profiler_config both configure" in capsys.readouterr().err
    assert cli.parse_settings(argv).engine_options() == {"profile_dir": "/tmp/t"}
