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
    # and what `vllm serve` 0.26's api_server imports beyond the engine (scripts/gpu/carry_imports.py)
    assert {"model-hosting-container-standards", "jmespath"} <= set(pinned)


def _stage(tmp_path: Path, carry: str, *steps: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "CARRY": carry,
        "STAGE": str(tmp_path / "stage24"),
        "SITE": str(tmp_path / "site24"),
    }
    script = ROOT / "scripts" / "gpu" / "stage_vllm.sh"
    return subprocess.run(["bash", str(script), *steps], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_a_second_vllm_stages_apart_from_the_first(tmp_path):
    """Two vLLM versions side by side in one lease: the second's pieces (another carry folder) go
    to their own stage, and its install refuses, naming the missing piece by its own folder, before
    anything is unpacked over the first version's site."""
    (tmp_path / ".vy" / "c1").mkdir(parents=True)
    (tmp_path / ".vy" / "c1" / "PIECE_1").write_text("0.24.0 1 2\n")
    (tmp_path / ".vy" / "c1" / "vllm.txz.part_00").write_bytes(b"x")
    (tmp_path / ".vx" / "c1").mkdir(parents=True)  # the first version's piece, not to be taken
    (tmp_path / ".vx" / "c1" / "PIECE_1").write_text("0.26.0 1 3\n")
    staged = _stage(tmp_path, ".vy", "piece")
    assert staged.returncode == 0, staged.stderr
    assert sorted(p.name for p in (tmp_path / "stage24" / "pieces").iterdir()) == ["PIECE_1", "vllm.txz.part_00"]
    assert (tmp_path / "stage24" / "pieces" / "PIECE_1").read_text().startswith("0.24.0")
    refused = _stage(tmp_path, ".vy", "install")
    assert refused.returncode == 2
    assert "vLLM 0.24.0's pieces still missing: .vy/c2" in refused.stderr
    assert not (tmp_path / "site24").exists()
    none = _stage(tmp_path, ".vz", "piece")
    assert none.returncode == 2 and "no .vz/cN travelled" in none.stderr


def test_a_server_row_names_its_vllm_site(tmp_path):
    """profile_gpu.sh's rows: the word VLLM_SITE=DIR puts that vLLM first on the server's path (the
    client's is unchanged); without it the server runs on the first version's site."""
    text = (ROOT / "scripts" / "gpu" / "profile_gpu.sh").read_text()
    body = re.search(r"^server_up\(\) \{.*?^\}", text, re.M | re.S).group(0)
    show_path = "python3 -c 'import os; print(os.environ[\"PYTHONPATH\"])'"
    probe = (
        body.replace("wait_server", ": ").replace("python3 -P -m reward_server", show_path)
        + '\nRES=$1; URL=x; COMMON=""\nserver_up a "VLLM_SITE=/tmp/site24 OMP_NUM_THREADS=1 --x"; wait\n'
        + 'cat "$RES/a.server.log"\nserver_up b "--x"; wait\ncat "$RES/b.server.log"\n'
    )
    out = subprocess.run(["bash", "-c", probe, "probe", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    lines = out.stdout.split()
    assert lines == [f"/tmp/site24:{ROOT}", f"/tmp/site:{ROOT}"], out.stderr
