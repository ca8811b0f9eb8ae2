"""The command line: seed flag names, presets, --help without engines, --gpu-ids before CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reward_server import cli
from reward_server.settings import ServerSettings


def test_help_lists_backends_without_importing_engines():
    code = (
        "import sys, contextlib, io\n"
        "from reward_server.cli import build_parser\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):\n"
        "    build_parser().parse_args(['--help'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'transformers'))\n"
        "print(heavy)\n"
        "print(buf.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, _, help_text = out.partition("\n")
    assert first == "[]"
    for name in ("qwen2_5_vl_vllm", "PRIMO-R1", "primo_r1_vllm", "vllm", "hf"):
        assert name in help_text
    for flag in (
        "--model-path",
        "--gpu-ids",
        "--tensor-parallel-size",
        "--primo-tensor-parallel-size",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--port",
        "--engine",
        "--host",
        "--config",
    ):
        assert flag in help_text


def test_defaults_match_the_seed():
    s = cli.parse_settings([])
    assert (s.backend, s.port, s.host, s.engine) == ("qwen2_5_vl_vllm", 18080, "127.0.0.1", "vllm")


def test_preset_then_flags(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("backend: PRIMO-R1\nmax-batch-size: 8\nport: 19000\nvideo_roots: [/data/episodes]\n")
    s = cli.parse_settings(["--config", str(preset), "--port", "19001", "--video-root", "/a", "--video-root", "/b"])
    assert s.backend == "PRIMO-R1" and s.max_batch_size == 8  # from the preset
    assert s.port == 19001 and s.video_roots == ["/a", "/b"]  # the command line wins


def test_primo_tensor_parallel_size_applies_to_primo_only():
    s = ServerSettings(tensor_parallel_size=1, primo_tensor_parallel_size=2)
    assert s.effective_tensor_parallel_size("PRIMO-R1") == 2
    assert s.effective_tensor_parallel_size("qwen2_5_vl_vllm") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "gpt4"], "unknown backend 'gpt4'"),
        (["--engine", "tgi"], "invalid choice: 'tgi'"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
        (["--config", "/no/such/preset.yaml"], "--config /no/such/preset.yaml"),
    ],
)
def test_bad_settings_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parse_settings(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_gpu_ids_set_before_the_engine_is_built(monkeypatch):
    seen = {}

    def fake_serve(settings):  # stands in for the server loop only; nothing of torch is touched
        import os

        seen["cuda"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        return 0

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test, whatever main() sets
    monkeypatch.setattr(cli, "serve", fake_serve)
    assert cli.main(["--gpu-ids", "2,3"]) == 0
    assert seen["cuda"] == "2,3"


def test_shipped_presets_are_valid():
    from pathlib import Path

    presets = sorted((Path(__file__).resolve().parents[2] / "configs" / "server").glob("*.yaml"))
    assert presets
    for preset in presets:
        cli.parse_settings(["--config", str(preset)])


def test_chat_flags_and_the_served_model_name():
    from reward_server.bootstrap import resolve

    s = cli.parse_settings(["--served-model-name", "judge", "--max-images-per-request", "8", "--engine", "fake"])
    assert (s.served_model_name, s.max_images_per_request) == ("judge", 8)
    # default: the last part of --model-path, the name RLinf's API reward worker derives
    named = resolve(cli.parse_settings(["--model-path", "/models/Qwen2.5-VL-7B-Instruct/", "--engine", "fake"]))
    assert named.served_model_name == "Qwen2.5-VL-7B-Instruct"
    assert resolve(cli.parse_settings(["--engine", "fake"])).served_model_name == "qwen2_5_vl_vllm"
    with pytest.raises(SystemExit):
        cli.parse_settings(["--max-images-per-request", "0"])
