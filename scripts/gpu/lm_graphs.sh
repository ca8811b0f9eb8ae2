#!/usr/bin/env bash
# A GPU experiment for issue 57's front (batch start to the GPU's first full steps): the language
# model's CUDA graphs for steps of one to three hook-path episodes, on the shipped preset.
#
#   bash scripts/gpu/lm_graphs.sh          # on the device, after stage_vllm.sh: ROWS in turn
#
# Why: vLLM captures its language model's piecewise CUDA graphs up to 512 tokens by default. A
# batch's first steps hold one to three episodes (~740 prompt tokens each) while the rest stream
# in, so they run the 28 layers' compiled pieces one launch at a time, bound by the host's CPU: the
# first episode's step took 58-123 ms on the hosts measured (its GPU work ~23 ms; the `first` field
# of the shipped preset's K = 1 files under docs/bench/, 2026-12-02 and 2026-12-07). Row `lmg` adds graph sizes every 256 tokens from 768 to 2816 to vLLM's default list
# (1 to 512 tokens); a step pads to the next size (at most 255 tokens). Row `base` is the preset as
# it ships. Each row compiles into a torch.compile cache of its own (VLLM_CACHE_ROOT by row name).
#
# `profile_gpu.sh ab` with the preset as the README starts it (SERVER_BASE), REPEATS (5) each,
# AB_ROUNDS (1), and each row's logprob scores of the same 64 episodes (FIDELITY_GEN=0) compared with
# the first row's. ROWS (base,lmg): the rows in order, e.g. ROWS=lmg2,base2 for a second round.
set -euo pipefail
cd "$(dirname "$0")/../.."
sizes=$(python3 -c 'import json; print(json.dumps([1, 2, 4, *range(8, 256, 8), *range(256, 513, 16), *range(768, 2817, 256)], separators=(",", ":")))')
rows=""
IFS=, read -r -a order <<<"${ROWS:-base,lmg}"
for row in "${order[@]}"; do
  case "$row" in
    base*) rows+="$row=VLLM_CACHE_ROOT=/tmp/vllm_cache_$row;" ;;
    lmg*) rows+="$row=VLLM_CACHE_ROOT=/tmp/vllm_cache_$row --engine-option compilation_config={\"cudagraph_capture_sizes\":$sizes};" ;;
    *) echo "unknown row $row" >&2; exit 2 ;;
  esac
done
SERVER_BASE=${SERVER_BASE:-"--config configs/server/qwen2_5_vl_7b.yaml --model-path /tmp/ckpt7b --gpu-ids 0"} \
  AB_ROUNDS=${AB_ROUNDS:-1} REPEATS=${REPEATS:-5} FIDELITY_GEN=${FIDELITY_GEN:-0} AB_ROWS="${rows%;}" \
  bash scripts/gpu/profile_gpu.sh ab
for f in "${RES:-/tmp/res}"/ab_*_r*.server.log; do  # what vLLM captured, and the start-up's length
  echo "== $(basename "$f")"
  grep -E "Capturing CUDA graphs|Graph capturing finished|init engine|cudagraph_capture_sizes" "$f" | cut -c1-240 | tail -4 || true
done
