#!/usr/bin/env bash
# Benchmarks on a lent GPU machine (device tool), after vLLM was staged there with
# ../shared/gpu/prepare_vllm_carry.sh (three carries; see docs/performance.md).
#
#   bash scripts/gpu/bench_gpu.sh vllm|vllm-default|hf|dp   results go to $OUT (default /tmp/out)
#   (dp: 1 vs 2 data-parallel engine ranks, on a 2-GPU machine)
#
# Builds a random-weight checkpoint with Qwen2.5-VL-7B's shapes (once per machine), then runs the
# raw engine and the server through the same workload: 16 frames of 256x256 per episode,
# N = 1, 8, 64 episodes arriving together, logprob (prefill only) and 256 new tokens.
set -euo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CKPT=/tmp/ckpt7b
[ -f $CKPT/config.json ] || python3 -m reward_server.tiny_checkpoint $CKPT --preset qwen2_5_vl_7b
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
TUNED="--max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN"
SERVER="--model-path $CKPT --dtype bfloat16 --max-model-len 8192 --max-batch-size 64 --log-level warning"
case "${1:?vllm, vllm-default or hf}" in
  vllm)
    python3 -m reward_server.bench_raw --engine vllm --model-path $CKPT $TUNED --out "$OUT/raw_vllm.json" 2>"$OUT/raw_vllm.log"
    python3 -m reward_server.bench --launch "$SERVER --engine vllm $TUNED" --n 1 8 64 \
      --styles logprob gen256 --out "$OUT/server_vllm.json" 2>"$OUT/server_vllm.log"
    ;;
  vllm-default)
    python3 -m reward_server.bench --launch "$SERVER --engine vllm" --n 64 --styles logprob \
      --no-sequential --out "$OUT/server_vllm_default.json" 2>"$OUT/server_vllm_default.log"
    ;;
  dp)
    for dp in 1 2; do
      python3 -m reward_server.bench --launch "$SERVER --engine vllm $TUNED --data-parallel-size $dp --max-batch-size 128" \
        --n 64 128 --styles logprob gen256 --no-sequential --repeats 1 --out "$OUT/server_dp$dp.json" 2>"$OUT/server_dp$dp.log"
    done
    ;;
  hf)
    python3 -m reward_server.bench_raw --engine hf --model-path $CKPT --n 1 8 64 --styles logprob gen256 \
      --repeats 1 --out "$OUT/raw_hf.json" 2>"$OUT/raw_hf.log"
    python3 -m reward_server.bench --launch "$SERVER --engine hf" --n 1 8 64 \
      --styles logprob gen256 --no-sequential --repeats 1 --out "$OUT/server_hf.json" 2>"$OUT/server_hf.log"
    ;;
esac
