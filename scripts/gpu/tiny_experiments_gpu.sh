#!/usr/bin/env bash
# scripts/run_tiny_experiments.sh on a lent GPU machine (device tool): tiny A, B and C through
# RLinf's train_embodied_agent.py with RLinf as released (no CPU shim; the default weight
# syncer), the reward server on the same GPU. After scripts/gpu/prepare_tiny_carry.sh .vx/tiny
# here, two device calls back to back on one warm machine:
#
#   run(carry=[".vx/tiny/t1"]): bash scripts/gpu/tiny_experiments_gpu.sh stage .vx/tiny/t1
#   run(carry=[".vx/tiny/t2"]): bash scripts/gpu/tiny_experiments_gpu.sh stage .vx/tiny/t2 \
#                                 && bash scripts/gpu/tiny_experiments_gpu.sh run
#
# `run` installs the staged wheels into /tmp/site, unpacks ray, robosuite with the task's assets
# and RLinf, renames RLinf v0.3's AutoModelForVision2Seq import when transformers >= 5 (the
# machine's transformers; RLinf pins 4), and writes into $OUT the summary table, the comparison
# PNG/CSV, every run's console and reward-server logs and the runner's TensorBoard files.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STAGE=/tmp/tiny_stage SITE=/tmp/site OUT=${OUT:-/tmp/out}

case "${1:?stage DIR | run}" in
  stage)
    mkdir -p "$STAGE" && cp -r "${2:?stage needs the carried folder}"/. "$STAGE/"
    exit 0 ;;
  run) ;;
  *) echo "usage: $0 stage DIR | run" >&2; exit 2 ;;
esac
[ -d "$STAGE/whl" ] && [ -f "$STAGE/ray.txz" ] || { echo "stage both carries first" >&2; exit 1; }
t0=$SECONDS

# MuJoCo renders through EGL; the image has NVIDIA's EGL driver but not the GL dispatch libraries
for deb in "$STAGE"/gl/*.deb; do dpkg -x "$deb" /; done
ldconfig
vendor=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$vendor" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$vendor

mkdir -p "$SITE"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$STAGE"/whl/*.whl
xz -dc "$STAGE/ray.txz" | tar xf - -C "$SITE"
xz -dc "$STAGE/robosuite_assets.txz" | tar xf - -C "$SITE"
rm -rf /tmp/rlinf_src && mkdir -p /tmp/rlinf_src
xz -dc "$STAGE/rlinf_src.txz" | tar xf - -C /tmp/rlinf_src
python3 - /tmp/rlinf_src/rlinf <<'PY'
# transformers 5 dropped AutoModelForVision2Seq; its successor takes the same checkpoints
import pathlib, re, sys
import transformers

if int(transformers.__version__.split(".")[0]) >= 5:
    for path in pathlib.Path(sys.argv[1]).rglob("*.py"):
        text = path.read_text()
        line = re.search(r"^from transformers import (.*\bAutoModelForVision2Seq\b.*)$", text, re.M)
        if not line:
            continue
        names = [n.strip() for n in line.group(1).split(",") if n.strip() != "AutoModelForVision2Seq"]
        new = "from transformers import AutoModelForImageTextToText as AutoModelForVision2Seq"
        if names:
            new = f"from transformers import {', '.join(names)}\n{new}"
        path.write_text(text[: line.start()] + new + text[line.end() :])
        print(f"transformers 5: renamed AutoModelForVision2Seq in {path.name}")
PY

# what run_tiny_experiments.sh calls the LIBERO environment: here, the machine's python3 + /tmp/site
venv=/tmp/libero-env
mkdir -p "$venv/bin" "$venv/libero_config"
printf '#!/bin/sh\nexec python3 "$@"\n' >"$venv/bin/python" && chmod +x "$venv/bin/python"
L="$SITE/libero/libero"
printf 'benchmark_root: %s\nbddl_files: %s/bddl_files\ninit_states: %s/init_files\ndatasets: %s/../datasets\nassets: %s/assets\n' \
  "$L" "$L" "$L" "$L" "$L" >"$venv/libero_config/config.yaml"
export PYTHONPATH=$SITE LIBERO_VENV=$venv PYTHON=python3 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
echo "setup took $((SECONDS - t0)) s" | tee "$OUT/timing.txt"
t1=$SECONDS
rc=0
bash "$ROOT/scripts/run_tiny_experiments.sh" --rlinf /tmp/rlinf_src --out /tmp/tiny 2>&1 | tee "$OUT/run_tiny.log" \
  || rc=$?
echo "run_tiny_experiments.sh: exit $rc, $((SECONDS - t1)) s" | tee -a "$OUT/timing.txt"
cp /tmp/tiny/summary.txt /tmp/tiny/compare.* "$OUT/" 2>/dev/null || true
for run_dir in /tmp/tiny/run*; do
  run=$(basename "$run_dir")
  mkdir -p "$OUT/$run"
  cp "$run_dir"/*.log "$run_dir"/*.txt "$OUT/$run/" 2>/dev/null || true
  log_path=$(cat "$run_dir/log_path" 2>/dev/null || true)
  [ -d "$log_path/tensorboard" ] && cp -r "$log_path/tensorboard" "$OUT/$run/"
done
exit $rc
