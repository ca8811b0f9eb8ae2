"""The GPU install is locked: requirements/gpu.lock pins vLLM, torch and what they pull, agrees with
pyproject.toml (every requirement pinned inside its range, vLLM at the upper bound), and
install_deps.sh installs with it where it installs vLLM for CUDA."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "gpu.lock"
PYTHONS = ("3.11", "3.12")  # what lock_deps.sh resolves the GPU lock for


def _pins(python: str) -> dict[str, Version]:
    """The lock's pins as pip reads them on this Python version (markers evaluated)."""
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"python_version": python}):
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", line
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name not in pins, f"{req.name} pinned twice for Python {python}"
        pins[name] = Version(spec.version)
    return pins


def _wanted() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [*project["dependencies"], *extras["server"], *extras["vllm"], *extras["primo"]]
    return [Requirement(r) for r in reqs if not r.startswith("vlm-reward-service")]


@pytest.mark.parametrize("python", PYTHONS)
def test_every_gpu_requirement_is_pinned_inside_its_range(python):
    pins = _pins(python)
    env = {"python_version": python, "sys_platform": "linux", "platform_machine": "x86_64"}
    for req in _wanted():
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req} is not in requirements/gpu.lock (bash scripts/lock_deps.sh --gpu)"
        assert req.specifier.contains(pins[name]), f"gpu.lock pins {name}=={pins[name]}, pyproject asks {req}"


@pytest.mark.parametrize("python", PYTHONS)
def test_the_lock_pins_the_measured_stack(python):
    """vLLM at pyproject's upper bound; the torch and transformers of the lent H200 machines."""
    pins = _pins(python)
    (vllm,) = [r for r in _wanted() if r.name == "vllm"]
    bounds = [Version(s.version) for s in vllm.specifier if s.operator == "<="]
    assert bounds == [pins["vllm"]], f"pyproject's {vllm} should end at the locked vllm {pins['vllm']}"
    assert pins["torch"] == Version("2.11.0")
    assert pins["transformers"].release[:2] == (5, 17)
    script = (ROOT / "scripts" / "lock_deps.sh").read_text()
    assert f"GPU_VLLM={pins['vllm']}\n" in script and f"GPU_TORCH={pins['torch']}\n" in script


def _install_args(tmp_path: Path, *flags: str) -> list[list[str]]:
    """Run install_deps.sh with a Python that records its pip calls instead of installing: what
    it would ask pip for, each call one list of arguments."""
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    subprocess.run(["bash", str(ROOT / "scripts" / "install_deps.sh"), *flags], check=True, env=env, timeout=60)
    return [line.split() for line in log.read_text().splitlines()]


def test_the_gpu_install_uses_the_gpu_lock(tmp_path):
    calls = _install_args(tmp_path, "--with-primo")
    pip = [c for c in calls if c[:3] == ["-m", "pip", "install"]]
    assert pip and all(["-c", str(LOCK)] == c[c.index("-c") : c.index("-c") + 2] for c in pip), calls
    assert pip[0][-1] == "pip"  # the locked pip first: it resolves as lock_deps.sh did
    assert pip[-1][-1].endswith("[server,primo,vllm]")


def test_unlocked_gpu_install_has_no_constraints(tmp_path):
    calls = _install_args(tmp_path, "--unlocked")
    assert all("-c" not in c for c in calls) and calls[-1][-1].endswith("[server,vllm]")
