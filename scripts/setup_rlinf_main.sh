#!/usr/bin/env bash
# An RLinf main checkout for tests and users without network access to GitHub, runnable with the
# simulator environment's Python (scripts/setup_libero_env.sh).
#
#   bash scripts/setup_rlinf_main.sh [DEST]     default: $REWARD_SERVER_CACHE/rlinf-main-<commit>
#                                               (REWARD_SERVER_CACHE: ~/.cache/reward_server)
#
# Unpacks the snapshot of RLinf's main branch found beside this checkout
# (../shared/rlinf_main/rlinf-main-<commit>.tar.xz, or RLINF_MAIN_TARBALL) into DEST, pristine
# (never patched: copy it, then scripts/apply_rlinf_patches.sh the copy), and installs into the
# simulator environment (LIBERO_VENV, default ~/.cache/reward_server/libero-venv) the few
# packages RLinf main's training entry point imports beyond v0.3's. The simulator environment keeps
# RLinf 0.3.0 installed; RLinf main is used the way its own run_embodiment.sh uses a checkout,
# from PYTHONPATH, which shadows the installed 0.3.0:
#
#   PYTHONPATH=DEST:<this repo> $LIBERO_VENV/bin/python DEST/examples/embodiment/train_embodied_agent.py ...
#
# Both RLinf versions need transformers 4 (main: <=4.57.6), torch, gymnasium 1.x and Ray from the
# same environment, so one environment serves both. Without CUDA, RLinf main needs the test-only
# CPU shim (tests/rlinf_cpu_shim_main.patch, applied by scripts/run_tiny_experiments.sh to its
# private copy). Prints RLINF_MAIN_DIR=DEST last. Safe to run again.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${REWARD_SERVER_CACHE:-$HOME/.cache/reward_server}
VENV=${LIBERO_VENV:-$CACHE/libero-venv}
log() { echo "[setup_rlinf_main] $*" >&2; }
die() { echo "setup_rlinf_main: $*" >&2; exit 1; }

tarball=${RLINF_MAIN_TARBALL:-}
if [ -z "$tarball" ]; then
  tarball=$(ls -1 "$ROOT"/../shared/rlinf_main/rlinf-main-*.tar.xz 2>/dev/null | sort | tail -1 || true)
fi
[ -n "$tarball" ] && [ -f "$tarball" ] \
  || die "no RLinf main snapshot: expected ../shared/rlinf_main/rlinf-main-<commit>.tar.xz beside this checkout (or set RLINF_MAIN_TARBALL)"
commit=$(basename "$tarball" .tar.xz)
commit=${commit#rlinf-main-}
dest=${1:-$CACHE/rlinf-main-$commit}

# Unpacked once; a marker names the tarball it came from, so a new snapshot replaces it.
if [ "$(cat "$dest/.snapshot" 2>/dev/null || true)" != "$(basename "$tarball")" ]; then
  log "unpacking $(basename "$tarball") into $dest"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  tar xJf "$tarball" -C "$dest.tmp"
  [ -f "$dest.tmp/rlinf/workers/env/env_worker.py" ] || die "$tarball holds no rlinf/ package"
  basename "$tarball" >"$dest.tmp/.snapshot"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
fi

# What RLinf main's runner imports that RLinf 0.3.0's does not (found by importing its training
# entry point's workers and runners in the simulator environment): sortedcontainers (replay
# buffer), aiohttp (rlinf/utils/http_client.py, the API reward worker's client).
imports="import rlinf.workers.env.async_env_worker, rlinf.runners.embodied_runner, rlinf.runners.async_embodied_runner
import rlinf.workers.actor.embodied_fsdp_actor_worker, rlinf.workers.rollout.hf.huggingface_worker, rlinf.workers.reward
import rlinf.envs.libero.libero_env"
if [ -x "$VENV/bin/python" ]; then
  if ! "$VENV/bin/python" -c "import sortedcontainers, aiohttp" 2>/dev/null; then
    log "installing what RLinf main's runner imports beyond RLinf 0.3.0's"
    constraints=()
    [ "${LIBERO_UNLOCKED:-0}" = 1 ] || constraints=(-c "$ROOT/requirements/libero.lock")
    "$VENV/bin/python" -m pip install -q "${constraints[@]}" sortedcontainers aiohttp
  fi
  if ! (cd "$dest" && PYTHONPATH="$dest" "$VENV/bin/python" -c "$imports" 2>/dev/null); then
    (cd "$dest" && PYTHONPATH="$dest" "$VENV/bin/python" -c "$imports") >&2 || true
    die "RLinf main at $dest does not import in $VENV (see above)"
  fi
  log "RLinf main imports in $VENV with PYTHONPATH=$dest"
else
  log "no simulator environment at $VENV (scripts/setup_libero_env.sh): unpacked only"
fi
echo "RLINF_MAIN_DIR=$dest"
