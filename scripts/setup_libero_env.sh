#!/usr/bin/env bash
# A separate Python environment with the real LIBERO-10 simulator and RLinf 0.3.0, rendering
# on CPU through Mesa: for the end-to-end tests of the patched env (the simulator stack pins
# numpy<2; the reward server's stack uses numpy 2, so the two live in different environments
# and talk over HTTP, as in real runs).
#
#   bash scripts/setup_libero_env.sh [VENV_DIR]     default: ~/.cache/reward_server/libero-venv
#
# Also ManiSkill 3 for RLinf's ManiSkill env, rendering on the CPU through Mesa's software Vulkan
# (scripts/setup_maniskill_env.sh; SKIP_MANISKILL=1 leaves it out), and RLinf main's checkout
# with its extra imports (scripts/setup_rlinf_main.sh; SKIP_RLINF_MAIN=1 leaves it out).
# Prints the environment variables the simulator needs. Safe to run again.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${LIBERO_VENV:-$HOME/.cache/reward_server/libero-venv}}
ASSET_TOOL=${LIBERO_ASSET_TOOL:-$ROOT/../shared/libero/fetch_assets.py}
log() { echo "[setup_libero_env] $*" >&2; }

if ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    log "installing Mesa (software OpenGL)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      libosmesa6 libgl1 libegl1 libegl-mesa0 libglx-mesa0 >/dev/null
  else
    log "Mesa's libOSMesa is missing and cannot be installed here (needs apt-get as root)"; exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Versions from requirements/libero.lock (LIBERO_UNLOCKED=1 resolves afresh: scripts/lock_deps.sh)
constraints=()
[ "${LIBERO_UNLOCKED:-0}" = 1 ] || constraints=(-c "$ROOT/requirements/libero.lock")
pip_install() { "$PY" -m pip install -q "${constraints[@]}" "$@"; }
if ! "$PY" -c "import rlinf, libero, robosuite, mujoco, reward_client" 2>/dev/null; then
  log "installing the simulator stack (a few minutes)"
  pip_install --upgrade pip
  # pinned: an unpinned robosuite 1.4.0 pulls mujoco and numpy releases it cannot run with
  pip_install torch==2.13.0 "numpy<2" mujoco==3.3.7 robosuite==1.4.0 bddl==1.0.1 future \
      "opencv-python<4.12" gym==0.26.2 omegaconf hydra-core easydict termcolor matplotlib h5py imageio ray
  pip_install --no-deps rlinf-libero==0.1.3 rlinf==0.3.0
  pip_install -e "$ROOT[mp4]"
fi

# RLinf's training entry point (examples/embodiment/train_embodied_agent.py) imports more than
# its LIBERO env. transformers stays at 4: v0.3 imports AutoModelForVision2Seq, gone in 5.
# torchvision: PyPI's only build for torch 2.13 is made for the standard torch build and its ops
# do not load against a local +cpu torch, so the standard build (it runs on CPU too) goes in.
if ! "$PY" -c "import torch, torchvision, transformers, accelerate, peft, pandas, gymnasium, tensorboard, psutil
torch.ops.torchvision.nms" 2>/dev/null; then
  log "installing what RLinf's training entry point imports (a few minutes, several GB)"
  if "$PY" -c "import sys, torch; sys.exit(not torch.__version__.endswith('+cpu'))"; then
    tmp=$(mktemp -d)
    PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --no-deps torch==2.13.0 -d "$tmp"
    PIP_FIND_LINKS= pip_install "$tmp"/torch-2.13.0-*.whl
    rm -rf "$tmp"
  fi
  PIP_FIND_LINKS= pip_install "numpy<2" torch==2.13.0 torchvision==0.28.0 transformers==4.57.6 \
      accelerate==1.15.0 peft==0.21.2 pandas==3.0.6 gymnasium==1.4.0 tensorboard==2.21.0 regex==2026.11.15 \
      tqdm==4.70.1 huggingface_hub==0.36.2 psutil==7.2.2
fi

LIBERO_PKG=$("$PY" -c "import importlib.util, os; print(os.path.join(importlib.util.find_spec('libero').submodule_search_locations[0], 'libero'))")
if [ -f "$ASSET_TOOL" ]; then
  "$PY" "$ASSET_TOOL" "$LIBERO_PKG/assets" >&2
elif [ ! -d "$LIBERO_PKG/assets" ]; then
  log "no LIBERO assets and no asset tool at $ASSET_TOOL (set LIBERO_ASSET_TOOL)"; exit 1
fi

# LIBERO asks interactively for its config on first import (EOFError without a terminal).
CONFIG_DIR="$VENV/libero_config"
mkdir -p "$CONFIG_DIR"
cat > "$CONFIG_DIR/config.yaml" <<YAML
benchmark_root: $LIBERO_PKG
bddl_files: $LIBERO_PKG/bddl_files
init_states: $LIBERO_PKG/init_files
datasets: $LIBERO_PKG/../datasets
assets: $LIBERO_PKG/assets
YAML

if [ "${SKIP_MANISKILL:-0}" != 1 ]; then
  bash "$ROOT/scripts/setup_maniskill_env.sh" "$VENV" >/dev/null
fi

# RLinf main (the snapshot beside this checkout, ../shared/rlinf_main/) for the tests and tiny runs
# on RLinf main: unpacked into the cache, its few extra imports installed here (the same
# environment runs both RLinf versions). SKIP_RLINF_MAIN=1 leaves it out.
if [ "${SKIP_RLINF_MAIN:-0}" != 1 ]; then
  if ls "$ROOT"/../shared/rlinf_main/rlinf-main-*.tar.xz >/dev/null 2>&1 || [ -n "${RLINF_MAIN_TARBALL:-}" ]; then
    LIBERO_VENV="$VENV" bash "$ROOT/scripts/setup_rlinf_main.sh" >/dev/null
  else
    log "no RLinf main snapshot beside this checkout (../shared/rlinf_main/): RLinf main left out"
  fi
fi

cat <<ENV
LIBERO_PYTHON=$PY
LIBERO_CONFIG_PATH=$CONFIG_DIR
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
MUJOCO_GL=egl
PYOPENGL_PLATFORM=egl
ENV
[ "${SKIP_MANISKILL:-0}" = 1 ] || log "ManiSkill on the CPU: . $VENV/vulkan/env.sh"
log "ready: $PY"
