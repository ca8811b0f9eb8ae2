#!/usr/bin/env bash
# Issue 57's numbers on the locked vLLM, in ONE lease of one H200 (~25 min of device time, calls of
# <= 10 min): the shipped preset started as the README's GPU quick start says, the hook path K = 1
# (64 episodes, median of 5), progress curves K = 1, 8, 16 (median of 3), PRIMO-R1 gen1 / gen256
# with its preset. Each mode runs scripts/gpu/profile_gpu.sh's ab, curves or primo mode on
# SERVER_BASE (the preset's command line) and writes under $OUT profile_gpu's ab.tgz, curves.tgz or
# primo.tgz (every JSON, table, phases report and step log) and k1.md, curves.md, primo.md (the
# tables to read first).
#
# Here, once (~5 min, downloads ~400 MB):
#   bash scripts/gpu/prepare_vllm_carry.sh 0.26.0 .vx   # prints N, the pieces' count (3-5: the tree takes
#                                                       # its share of each 64 MiB call)
# Then on the device, back to back (a machine stays warm ~30 s between calls); with N = 4:
#   run(carry=[".vx/c1"], timeout_s=300): bash scripts/gpu/stage_vllm.sh piece
#   run(carry=[".vx/c2"], timeout_s=300): bash scripts/gpu/stage_vllm.sh piece
#   run(carry=[".vx/c3"], timeout_s=300): bash scripts/gpu/stage_vllm.sh piece
#   run(carry=[".vx/c4"], timeout_s=600): bash scripts/gpu/stage_vllm.sh piece install && bash scripts/gpu/measure_issue57.sh k1
#   run(timeout_s=600):                   bash scripts/gpu/measure_issue57.sh curves primo
# Device time, planned: staging ~1 min a call; k1 ~6 min (install 1-2, two servers of 1-2 min each);
# curves + primo ~6 min. If a call ends at its limit, run the modes it did not finish on their own.
#
# k1:     the hook path K = 1, two servers in turn: `v2` exactly the quick start (vLLM 0.26 runs
#         Qwen2.5-VL on its Model Runner V2 by default) and `v1` the same with VLLM_USE_V2_MODEL_RUNNER=0
#         (the runner every patch here was measured on); greedy answers of 8 tokens compared (fidelity).
# curves: K = 1, 8, 16 on the preset (RUNNER=v1: with VLLM_USE_V2_MODEL_RUNNER=0).
# primo:  PRIMO-R1 gen1 and gen256 on configs/server/primo_r1_7b.yaml, tensor parallel 1 (one GPU).
#
# The servers get what the quick start gives, plus --port and --engine-option step_log (the engine's
# per-step log the phases reports read); the preset's GPUs are replaced by --gpu-ids 0.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/out}
CKPT=/tmp/ckpt7b
QUICK="--model-path $CKPT --gpu-ids 0"
export N=64 PYTHONPATH=/tmp/site:$PWD
[ $# -gt 0 ] || { echo "usage: measure_issue57.sh k1|curves|primo ..." >&2; exit 2; }
python3 -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)"

summary() {  # mode: the tables of its results, one markdown file
  local mode=$1 res=$2
  { echo "# issue 57, $mode: vLLM $(python3 -c 'import vllm; print(vllm.__version__)'), $(cat "$res/gpu.txt")"
    for f in "$res"/*.txt "$res"/*_table.md "$res"/*_phases.md; do
      [ -f "$f" ] || continue
      case $f in */gpu.txt|*/host.txt) continue ;; esac
      printf '\n## %s\n\n```\n' "$(basename "$f")"; cat "$f"; printf '```\n'
    done; } >"$OUT/$mode.md"
}

for mode in "$@"; do
  res=/tmp/res_$mode
  rm -rf "$res"
  case $mode in
    k1)
      RES=$res SERVER_BASE="--config configs/server/qwen2_5_vl_7b.yaml $QUICK" AB_ROUNDS=1 REPEATS=5 FIDELITY_GEN=8 \
        AB_ROWS="v2=;v1=VLLM_USE_V2_MODEL_RUNNER=0" bash "$HERE/profile_gpu.sh" ab
      ;;
    curves)
      runner=""
      [ "${RUNNER:-v2}" = v1 ] && runner="VLLM_USE_V2_MODEL_RUNNER=0"
      # shellcheck disable=SC2086  # the runner's NAME=VALUE, if any
      env $runner RES=$res SERVER_BASE="--config configs/server/qwen2_5_vl_7b.yaml $QUICK" CURVE_REPEATS=3 \
        bash "$HERE/profile_gpu.sh" curves
      ;;
    primo)
      RES=$res SERVER_BASE="--config configs/server/primo_r1_7b.yaml $QUICK --primo-tensor-parallel-size 1" \
        PRIMO_STYLES="gen1 gen256" REPEATS=3 bash "$HERE/profile_gpu.sh" primo
      ;;
    *) echo "measure_issue57.sh: unknown mode $mode (k1, curves, primo)" >&2; exit 2 ;;
  esac
  summary "$mode" "$res"
done
