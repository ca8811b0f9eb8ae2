"""scripts/gpu/measure_issue57.sh runs on a lent GPU in one lease, with no second chance: the
servers it starts must be the README's quick start on the shipped presets (flags the server takes,
the GPU ids of a one-GPU machine, the encoder switches on) before the lease is spent."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from reward_server import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "measure_issue57.sh"


def _server_bases() -> dict[str, list[str]]:
    text = SCRIPT.read_text()
    quick = re.search(r'^QUICK="([^"]+)"', text, re.M).group(1).replace("$CKPT", "/tmp/ckpt7b")
    bases = {}
    for mode, base in re.findall(r"^    (\w+)\)\n(?:.*\n)*?.*?SERVER_BASE=\"([^\"]+)\"", text, re.M):
        bases[mode] = shlex.split(base.replace("$QUICK", quick))
    return bases


def test_every_mode_starts_a_server():
    assert set(_server_bases()) == {"k1", "curves", "primo"}
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


@pytest.mark.parametrize("mode", ["k1", "curves", "primo"])
def test_the_servers_are_the_quick_start_on_the_presets(mode):
    argv = _server_bases()[mode]
    assert argv[:2] in (
        ["--config", "configs/server/qwen2_5_vl_7b.yaml"],
        ["--config", "configs/server/primo_r1_7b.yaml"],
    )
    # the README's GPU quick start starts the judges the same way
    assert f"python -m reward_server --config {argv[1]} --model-path" in (ROOT / "README.md").read_text()
    argv[1] = str(ROOT / argv[1])
    # what profile_gpu.sh's server_up adds
    settings = cli.parse_settings([*argv, "--engine-option", "step_log=/tmp/steps.jsonl", "--port", "18080"])
    assert settings.gpu_ids == "0"  # the presets name GPUs 6 / 6,7; the lent machine has one
    assert settings.compile_mm_encoder and settings.cudagraph_mm_encoder
    if mode == "primo":
        assert settings.backend == "PRIMO-R1" and settings.effective_tensor_parallel_size("PRIMO-R1") == 1
    else:
        assert settings.backend == "qwen2_5_vl_vllm" and settings.warmup_batch == 64


def test_the_vllm_carry_takes_the_gpu_locks_versions():
    """The carry for the locked vLLM travels what a locked install gets: once it carried openai 2.14,
    which `vllm serve` 0.26 cannot import (the lock has 3.57, on httpx2), so the chat route was never
    measured against it."""
    carry = (ROOT / "scripts" / "gpu" / "prepare_vllm_carry.sh").read_text()
    deps = shlex.split(re.search(r"^DEPS=\(([^)]*)\)", carry, re.M).group(1).replace("\\\n", " "))
    lock = ROOT / "requirements" / "gpu.lock"
    out = subprocess.run(
        ["python3", str(ROOT / "scripts" / "lock_gpu.py"), "pins", str(lock), "3.12", *deps],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(out) == len(deps)
    locked = dict(line.split("==", 1) for line in lock.read_text().splitlines() if "==" in line and ";" not in line)
    pinned = dict(item.split("==", 1) for item in out if "==" in item)
    assert pinned["openai"] == locked["openai"] and pinned["httpx2"] == locked["httpx2"]
    assert pinned["fastapi"] == locked["fastapi"]  # a range ("fastapi<0.137") takes the lock's pin too
    assert "av" in pinned  # two lines in the lock, one a Python: 3.12's
    # every package `vllm serve`'s OpenAI client needs to import travels
    assert {"openai", "httpx2", "httpcore2", "truststore"} <= set(pinned)
