"""RLinf v0.3 for tests: its wheel unpacked, the patches applied (scripts/apply_rlinf_patches.sh),
its config groups (the reference copy next to this repository, shared/rlinf_v0.3, or
RLINF_V03_CONFIGS) and the simulator's environment (scripts/setup_libero_env.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APPLY = REPO / "scripts" / "apply_rlinf_patches.sh"
SHARED_CONFIGS = Path(
    os.environ.get("RLINF_V03_CONFIGS", REPO.parent / "shared" / "rlinf_v0.3" / "examples" / "embodiment" / "config")
)
CACHE = Path(os.environ.get("REWARD_SERVER_CACHE", Path.home() / ".cache" / "reward_server"))
LIBERO_VENV = Path(os.environ.get("LIBERO_VENV", CACHE / "libero-venv"))
RUNS = ("runA", "runB_qwen", "runB3_qwen3", "runC_primo")


def rlinf_wheel() -> Path:
    cached = sorted(CACHE.glob("rlinf-0.3.0-*.whl"))
    if cached:
        return cached[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "rlinf==0.3.0", "-d", str(CACHE)], check=True
    )
    return sorted(CACHE.glob("rlinf-0.3.0-*.whl"))[0]


def unpack(dest: Path) -> Path:
    with zipfile.ZipFile(rlinf_wheel()) as wheel:
        for name in wheel.namelist():
            if name.startswith("rlinf/"):
                wheel.extract(name, dest)
    return dest


def apply_patches(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(APPLY), *args], capture_output=True, text=True)


def make_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel's source twice: as released, and patched with the run configs installed
    next to RLinf's v0.3 config groups."""
    if not SHARED_CONFIGS.is_dir():
        pytest.fail(f"RLinf v0.3 config groups not found at {SHARED_CONFIGS} (set RLINF_V03_CONFIGS)")
    original = unpack(tmp_path_factory.mktemp("rlinf_original"))
    patched = unpack(tmp_path_factory.mktemp("rlinf_patched"))
    shutil.copytree(SHARED_CONFIGS, patched / "examples" / "embodiment" / "config")
    assert apply_patches(str(patched)).returncode == 0
    return {"original": original, "patched": patched, "config": patched / "examples" / "embodiment" / "config"}


RUN_D = "libero_10_ppo_openvlaoft_runD_dense"


# what runs A, B and C of one config family may change: the judge (none, Qwen, PRIMO-R1) and the name
RUN_KEYS = frozenset(
    {"env.train.reward_model.enable", "env.train.reward_model.backend", "runner.logger.experiment_name"}
)


def assert_runs_differ_only_in_reward(flat: dict[str, dict]) -> None:
    """Runs A, B, B3 and C (flattened configs by name in RUNS) are one config but for the judge: A
    has none, B Qwen2.5-VL, B3 Qwen3-VL, C PRIMO-R1, and evaluation keeps the simulator's own
    success everywhere."""
    first, *rest = RUNS
    for run in rest:
        differing = {k for k in flat[first].keys() | flat[run].keys() if flat[first].get(k) != flat[run].get(k)}
        assert differing <= RUN_KEYS, (run, differing - RUN_KEYS)
    assert flat["runA"]["env.train.reward_model.enable"] is False
    assert flat["runB_qwen"]["env.train.reward_model.backend"] == "qwen2_5_vl_vllm"
    assert flat["runB3_qwen3"]["env.train.reward_model.backend"] == "qwen3_vl"
    assert flat["runC_primo"]["env.train.reward_model.backend"] == "PRIMO-R1"
    for run in RUNS:
        assert not any(k.startswith("env.eval.reward_model") for k in flat[run]), run  # eval: native success


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested config as one level of dotted keys."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


STAND_IN_LAUNCHER = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    # stand-in for RLinf's run_embodiment.sh: no training, only what the experiment script relies on
    set -eu
    config=$1
    log_dir="logs/$(date +%Y%m%d-%H%M%S%N)-$config"
    mkdir -p "$log_dir"
    # the judged runs' reward client waits for the server (reward_model.wait_ready_s), which loads
    # while RLinf starts; run A has none
    health=none
    case "$config" in *_runA) ;; *)
      for _ in $(seq 1 240); do
        health=$(curl -sf "http://127.0.0.1:$REWARD_PORT/health") && break
        health=none; sleep 0.5
      done ;;
    esac
    echo "$health" > "$log_dir/reward_health.json"
    [ "${FAIL_CONFIG:-}" = "$config" ] && { echo "training crashed" >&2; exit 1; }
    python - "$log_dir" "$config" <<'PY'
    import sys, math
    from torch.utils.tensorboard import SummaryWriter
    log_dir, config = sys.argv[1], sys.argv[2]
    shift = {"runA": 0.0, "runB_qwen": 0.05, "runB3_qwen3": 0.07, "runC_primo": 0.1}[config.split("openvlaoft_")[1]]
    w = SummaryWriter(f"{log_dir}/tensorboard")
    for step in range(0, 50, 5):
        w.add_scalar("env/success_once", min(1.0, 0.2 + shift + step / 100), step)
        w.add_scalar("env/return", 5 * (0.2 + shift + step / 100), step)
        if config != "libero_10_grpo_openvlaoft_runA":
            w.add_scalar("env/vlm_score", 0.3 + shift + 0.1 * math.sin(step / 10), step)
        if step % 10 == 0:
            w.add_scalar("eval/success_once", 0.1 + shift + step / 120, step)
    w.close()
    PY
    """
)


def stand_in_tree(dest: Path) -> Path:
    """RLinf's source, patched, with the stand-in launcher in place of run_embodiment.sh."""
    tree = unpack(dest)
    assert subprocess.run(["bash", str(APPLY), str(tree)], capture_output=True).returncode == 0
    launcher = tree / "examples" / "embodiment" / "run_embodiment.sh"
    launcher.write_text(STAND_IN_LAUNCHER)
    return tree


def simulator_env() -> dict:
    """The environment for a driver in the simulator's venv: this repository importable, no GPU,
    and Mesa's lavapipe for ManiSkill's Vulkan rendering where scripts/setup_maniskill_env.sh put it."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
    vulkan = LIBERO_VENV / "vulkan"
    if (vulkan / "icd.json").exists():  # lavapipe (scripts/setup_maniskill_env.sh)
        env["VK_ICD_FILENAMES"] = str(vulkan / "icd.json")
        env["LD_LIBRARY_PATH"] = f"{vulkan / 'lib'}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
    env["PYTHONPATH"] = str(REPO)
    return env


def maniskill_python() -> str:
    """The simulator venv's python, with ManiSkill in it (else the test fails, saying how to set it up)."""
    python = LIBERO_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(
            f"no simulator environment at {LIBERO_VENV}: run `bash scripts/setup_libero_env.sh` (it sets up "
            "ManiSkill too), or deselect with -m 'not maniskill'"
        )
    check = subprocess.run([str(python), "-c", "import mani_skill"], capture_output=True, env=simulator_env())
    if check.returncode != 0:
        pytest.fail(f"ManiSkill missing in {LIBERO_VENV}: bash scripts/setup_maniskill_env.sh")
    return str(python)


def _has_worker(tree: Path) -> bool:
    return (tree / "rlinf" / "workers" / "reward" / "api_reward_worker.py").exists()


def rlinf_main_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An RLinf main checkout: RLINF_MAIN_DIR, else the one scripts/setup_rlinf_main.sh unpacks
    into the cache, else the snapshot beside this checkout unpacked here."""
    named = os.environ.get("RLINF_MAIN_DIR")
    candidates = [Path(named)] if named else sorted(CACHE.glob("rlinf-main-*"), reverse=True)
    for tree in candidates:
        if _has_worker(tree):
            return tree
    tarballs = sorted((REPO.parent / "shared" / "rlinf_main").glob("rlinf-main-*.tar.xz"))
    if not tarballs:
        pytest.fail("no RLinf main checkout: run `bash scripts/setup_libero_env.sh` or set RLINF_MAIN_DIR")
    dest = tmp_path_factory.mktemp("rlinf_main")
    with tarfile.open(tarballs[-1]) as tar:
        tar.extractall(dest, filter="data")
    return dest


STAND_IN_ENTRY_POINT = textwrap.dedent(
    """\
    # stand-in for train_embodied_agent.py: records how it was started, leaves a child behind
    import json, os, subprocess, sys
    args = sys.argv[1:]
    log_path = next(a.split("=", 1)[1] for a in args if a.startswith("runner.logger.log_path="))
    child = subprocess.Popen(["sleep", "300"])  # like a Ray process the driver did not stop
    env = {k: os.environ.get(k) for k in ("EMBODIED_PATH", "PYTHONPATH", "ROBOT_PLATFORM", "MUJOCO_GL")}
    with open(os.path.join(log_path, "started.json"), "w") as f:
        json.dump({"args": args, "env": env, "cwd": os.getcwd(), "child": child.pid}, f)
    """
)
