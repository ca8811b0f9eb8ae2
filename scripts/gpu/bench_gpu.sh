#!/usr/bin/env bash
# Benchmarks on a lent GPU machine (device tool), after vLLM was staged there with
# ../shared/gpu/prepare_vllm_carry.sh (three carries) and this project's extra wheels were
# installed into /tmp/site (see docs/performance.md, "Reproduce").
#
#   bash scripts/gpu/bench_gpu.sh vllm|hf|ray      results go to $OUT (default /tmp/out)
#
# vllm: the bare engine, the server on every path users run (hook raw batch, hook JSON batch,
#       hook MP4 video_path, concurrent /score) and plain `vllm serve` on the same prompt and
#       frames, one after another on one GPU, then one table (reward_tools.bench_report).
# hf:   the transformers engine bare and through the server (hook raw batch).
# split: two servers, one per GPU, behind the client's replica list (it splits each batch),
#       against one of them alone, on the hook path (needs 2 GPUs).
# ray:  Ray Serve with 1 and 2 replicas (one GPU each) on the hook path (needs 2 GPUs and Ray).
# Workload: a random-weight checkpoint with Qwen2.5-VL-7B's shapes, 16 frames of 256x256 per
# episode, N = 64 episodes ending together, logprob (prefill only) and 256 new tokens.
set -euo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CKPT=/tmp/ckpt7b
[ -f $CKPT/config.json ] || python3 -m reward_server.tiny_checkpoint $CKPT --preset qwen2_5_vl_7b >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
TUNED="--max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN"
COMMON="--model-path $CKPT --dtype bfloat16 --max-model-len 8192 --log-level warning --gpu-memory-utilization 0.85"
N=${N:-64}
STYLES=${STYLES:-logprob gen256}

wait_http() {  # url, seconds
  for _ in $(seq "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done
  echo "not ready: $1" >&2; return 1
}

case "${1:?vllm, hf or ray}" in
  vllm)
    python3 -m reward_tools.bench_raw --engine vllm --model-path $CKPT $TUNED --n "$N" --styles $STYLES \
      --gpu-memory-utilization 0.85 --out "$OUT/raw_vllm.json" 2>"$OUT/raw_vllm.log"
    python3 -m reward_tools.bench --launch "$COMMON --engine vllm $TUNED" --n "$N" --styles $STYLES \
      --paths hook_raw hook_json hook_mp4 concurrent --out "$OUT/server_vllm.json" 2>"$OUT/server_vllm.log"
    # plain `vllm serve`, same engine settings; 16 frames per MP4, encoded at 2 fps by the client
    python3 -m vllm.entrypoints.openai.api_server --model $CKPT --dtype bfloat16 --max-model-len 8192 \
      --gpu-memory-utilization 0.85 $TUNED --limit-mm-per-prompt '{"image": 2, "video": 1}' \
      --media-io-kwargs '{"video": {"num_frames": 16}}' --port 18000 \
      >"$OUT/vllm_serve.log" 2>&1 &
    peer=$!
    trap 'kill $peer 2>/dev/null || true' EXIT
    wait_http http://127.0.0.1:18000/health 600
    python3 -m reward_tools.bench --peer-url http://127.0.0.1:18000 --peer-model $CKPT --n "$N" --styles $STYLES \
      --out "$OUT/peer_vllm_serve.json" 2>"$OUT/peer.log"
    kill $peer; wait $peer 2>/dev/null || true
    python3 -m reward_tools.bench_report "$OUT"/raw_vllm.json "$OUT"/server_vllm.json "$OUT"/peer_vllm_serve.json \
      | tee "$OUT/table_vllm.md"
    ;;
  hf)
    python3 -m reward_tools.bench_raw --engine hf --model-path $CKPT --n "$N" --styles $STYLES \
      --repeats 1 --out "$OUT/raw_hf.json" 2>"$OUT/raw_hf.log"
    python3 -m reward_tools.bench --launch "$COMMON --engine hf --max-batch-size $N" --n "$N" --styles $STYLES \
      --paths hook_raw --repeats 1 --out "$OUT/server_hf.json" 2>"$OUT/server_hf.log"
    python3 -m reward_tools.bench_report "$OUT"/raw_hf.json "$OUT"/server_hf.json | tee "$OUT/table_hf.md"
    ;;
  split)
    for gpu in 0 1; do
      python3 -m reward_server $COMMON --engine vllm $TUNED --gpu-ids $gpu --port 1808$gpu \
        >"$OUT/split_server_$gpu.log" 2>&1 &
    done
    trap 'pkill -f "reward_server .*--port 1808" || true' EXIT
    wait_http http://127.0.0.1:18080/health 900 && wait_http http://127.0.0.1:18081/health 900
    python3 -m reward_tools.bench --url http://127.0.0.1:18080 --n 64 128 --styles $STYLES --paths hook_raw \
      --repeats 2 --out "$OUT/split_1.json" 2>"$OUT/split_bench_1.log"
    python3 -m reward_tools.bench --url http://127.0.0.1:18080,http://127.0.0.1:18081 --n 64 128 --styles $STYLES \
      --paths hook_raw --repeats 2 --out "$OUT/split_2.json" 2>"$OUT/split_bench_2.log"
    python3 -m reward_tools.bench_report "$OUT"/split_1.json "$OUT"/split_2.json | tee "$OUT/table_split.md"
    ;;
  ray)
    for replicas in 1 2; do
      python3 -m reward_server serve-ray --num-replicas $replicas --gpus-per-replica 1 --cpus-per-replica 4 \
        $COMMON --engine vllm $TUNED --port 18080 >"$OUT/ray_$replicas.log" 2>&1 &
      ray_pid=$!
      wait_http http://127.0.0.1:18080/health 900
      python3 -m reward_tools.bench --url http://127.0.0.1:18080 --n 64 128 --styles $STYLES --paths hook_raw \
        --repeats 1 --out "$OUT/ray_$replicas.json" 2>"$OUT/ray_bench_$replicas.log"
      kill -TERM $ray_pid; wait $ray_pid 2>/dev/null || true
      python3 -c "import ray; ray.shutdown()" 2>/dev/null || true
    done
    python3 -m reward_tools.bench_report "$OUT"/ray_1.json "$OUT"/ray_2.json | tee "$OUT/table_ray.md"
    ;;
esac
