#!/usr/bin/env bash
# Stage vLLM 0.24 and this project's extra wheels on a fresh lent GPU machine, in three device calls
# back to back (a machine stays warm ~30 s between calls). Prepare the carries here first:
#   bash ../shared/gpu/prepare_vllm_carry.sh .vx        # .vx/p1 p2 p3 (the vLLM recipe)
#   .vx/x: av, httptools, orjson, loguru wheels for Python 3.12 (the server's decode workers import
#          av; loguru for FP8), e.g. pip download --no-deps --only-binary=:all: --python-version 3.12 ...
# then on the device:
#   run(carry=[".vx/p1"]):          bash scripts/gpu/stage_vllm.sh 1
#   run(carry=[".vx/p2"]):          bash scripts/gpu/stage_vllm.sh 2
#   run(carry=[".vx/xa"]):          bash scripts/gpu/stage_vllm.sh 2x   (av: .vx/x with it outgrew a carry)
#   run(carry=[".vx/p1d"]):         bash scripts/gpu/stage_vllm.sh 2x   (p1's deps/ folder, moved out once p1
#                                     and the tree outgrew one; with .vx/xa and the tree it passed 64 MiB)
#   run(carry=[".vx/p3", ".vx/x"]): bash scripts/gpu/stage_vllm.sh 3 && <the measurement>
# The tree (~15 MiB, growing with docs/bench) and a carry share 64 MiB: p2's fa3.xz travels in .vx/p3 and p1's deps/ in .vx/p1d;
# every step copies into /tmp/stage, so the layout there is the recipe's.
# Step 3 installs into /tmp/site and writes the random-weight 7B-shaped checkpoint to /tmp/ckpt7b.
set -euo pipefail
case "${1:?1, 2 or 3}" in
  1) mkdir -p /tmp/stage && cp -r .vx/p1/* /tmp/stage/ ;;
  2) cp -r .vx/p2/* /tmp/stage/ ;;
  2x)  # wheels too large to travel with step 3 (av), and p1's deps/ when it travels apart (.vx/p1d): whichever came
    mkdir -p /tmp/stage_x
    if [ -d .vx/xa ]; then cp .vx/xa/*.whl /tmp/stage_x/; fi
    if [ -d .vx/p1d ]; then cp -r .vx/p1d/* /tmp/stage/; fi
    ;;
  3)
    cp -r .vx/p3/* /tmp/stage/
    bash .vx/p3/device_install.sh
    # shellcheck disable=SC2046  # wheel lists
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .vx/x/*.whl \
      $(ls /tmp/stage_x/*.whl 2>/dev/null)
    export PYTHONPATH=/tmp/site:$PWD
    [ -f /tmp/ckpt7b/config.json ] || python3 -m reward_server.tiny_checkpoint /tmp/ckpt7b --preset qwen2_5_vl_7b >/dev/null
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
  *) echo "stage 1, 2, 2x or 3" >&2; exit 2 ;;
esac
