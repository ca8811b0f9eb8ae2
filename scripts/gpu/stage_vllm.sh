#!/usr/bin/env bash
# Stage vLLM and this project's extra wheels on a fresh lent GPU machine (device tool).
#
# The pieces of scripts/gpu/prepare_vllm_carry.sh (vLLM 0.26.0 or 0.24.0; as many pieces as the tree
# leaves room for in a 64 MiB call, it prints the calls), back to back (a machine stays warm ~30 s
# between calls):
#   run(carry=[".vx/c1"]): bash scripts/gpu/stage_vllm.sh piece
#   ...
#   run(carry=[".vx/cN"]): bash scripts/gpu/stage_vllm.sh piece install && <the measurement>
# `piece` copies every .vx/cK that travelled (or stayed) into /tmp/stage; `install` refuses, naming
# them, while pieces are missing, then installs into /tmp/site and writes the random-weight
# 7B-shaped checkpoint to /tmp/ckpt7b.
#
# A second vLLM beside the first, in the same lease (two versions side by side on one card): its
# pieces made with another OUT (`prepare_vllm_carry.sh 0.24.0 .vy`), staged and installed apart with
#   CARRY=.vy STAGE=/tmp/stage_0.24.0 SITE=/tmp/site_0.24.0 bash scripts/gpu/stage_vllm.sh piece [install]
# (as prepare_vllm_carry.sh prints them), and a server row run on it with the word
# VLLM_SITE=/tmp/site_0.24.0 (profile_gpu.sh's rows).
#
# The earlier recipe (../shared/gpu/prepare_vllm_carry.sh, vLLM 0.24 in .vx/p1 p2 p3, .vx/x, .vx/xa,
# .vx/p1d), steps 1, 2, 2x, 2x, 3:
#   run(carry=[".vx/p1"]):          bash scripts/gpu/stage_vllm.sh 1
#   run(carry=[".vx/p2"]):          bash scripts/gpu/stage_vllm.sh 2
#   run(carry=[".vx/xa"]):          bash scripts/gpu/stage_vllm.sh 2x   (av: .vx/x with it outgrew a carry)
#   run(carry=[".vx/p1d"]):         bash scripts/gpu/stage_vllm.sh 2x   (p1's deps/ folder, moved out once p1
#                                     and the tree outgrew one; with .vx/xa and the tree it passed 64 MiB)
#   run(carry=[".vx/p3", ".vx/x"]): bash scripts/gpu/stage_vllm.sh 3 && <the measurement>
# The tree and a carry share 64 MiB: p2's fa3.xz travels in .vx/p3 and p1's deps/ in .vx/p1d;
# every step copies into /tmp/stage, so the layout there is the recipe's.
set -euo pipefail
CARRY=${CARRY:-.vx} STAGE=${STAGE:-/tmp/stage} SITE=${SITE:-/tmp/site}
[ $# -gt 0 ] || { echo "usage: stage_vllm.sh piece [install] | 1 | 2 | 2x | 3" >&2; exit 2; }

checkpoint() {
  export PYTHONPATH=$SITE:$PWD
  [ -f /tmp/ckpt7b/config.json ] || python3 -m reward_server.tiny_checkpoint /tmp/ckpt7b --preset qwen2_5_vl_7b >/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}

for step in "$@"; do
case "${step:?piece, install, 1, 2, 2x or 3}" in
  piece)
    mkdir -p "$STAGE/pieces"
    found=0
    for dir in "$CARRY"/c[0-9]*/; do
      [ -d "$dir" ] || continue
      cp "$dir"* "$STAGE/pieces/"; found=1
    done
    [ "$found" = 1 ] || { echo "stage_vllm.sh piece: no $CARRY/cN travelled (name it in carry)" >&2; exit 2; }
    echo "staged: $(cd "$STAGE/pieces" && ls PIECE_* | tr '\n' ' ')"
    ;;
  install)
    S=$STAGE/pieces
    read -r version _ total < "$(ls "$S"/PIECE_* | head -1)"
    missing=$(for i in $(seq 1 "$total"); do [ -f "$S/PIECE_$i" ] || printf ' %s/c%s' "$CARRY" "$i"; done)
    [ -z "$missing" ] || { echo "stage_vllm.sh install: vLLM $version's pieces still missing:$missing" >&2; exit 2; }
    mkdir -p "$SITE"
    cat "$S"/vllm.txz.part_* | xz -dc | tar xf - -C "$SITE"
    cat "$S"/fa3.xz.part_* | xz -dc > "$SITE/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$S"/*.whl
    PYTHONPATH=$SITE python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    checkpoint
    ;;
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
    checkpoint
    ;;
  *) echo "stage_vllm.sh: piece, install, or the earlier recipe's 1, 2, 2x, 3" >&2; exit 2 ;;
esac
done
