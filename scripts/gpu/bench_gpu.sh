#!/usr/bin/env bash
# Benchmarks on a lent GPU machine (device tool), after vLLM was staged there with
# ../shared/gpu/prepare_vllm_carry.sh (three carries) and this project's extra wheels were
# installed into /tmp/site (see docs/performance.md, "Reproduce").
#
#   bash scripts/gpu/bench_gpu.sh vllm|hf|split|warmup|ceiling|ray|chat|curves   results go to $OUT (default /tmp/out)
#
# vllm: the bare engine, the server on every path users run (hook raw batch, hook JSON batch,
#       hook MP4 video_path, concurrent /score) and plain `vllm serve` on the same prompt and
#       frames, one after another on one GPU, then one table (reward_tools.bench_report).
# hf:   the transformers engine bare and through the server (hook raw batch).
# split: two servers, one per GPU, behind the client's replica list (it splits each batch),
#       against one of them alone, on the hook path (needs 2 GPUs).
# warmup: the first batch after the server started against the steady ones that follow
#       (reward_tools.bench --first-batch), per row of WARMUP_ROWS (default "off on full": no
#       warm-up, the default warm-up batch of 8, a warm-up batch of N), one GPU.
# ceiling: each setting of CEILING (default "bf16 fp8 fp8kv compile": bf16; FP8 weights; FP8
#       weights and KV cache; the vision encoder compiled) on the hook path (the extra setting
#       "encoder" adds CUDA graphs of the encoder, which crash vLLM 0.24 on Qwen2.5-VL video),
#       bf16 also with frames put on the grid by the client (--to-grid), then the score fidelity
#       of each setting against bf16 on the same episodes (reward_tools.fidelity); one GPU. Keep
#       bf16 in every call's CEILING (the fidelity reference); ~2 min a setting.
# ray:  scale-out the way RLinf sends: CLIENTS (default "2 4") client processes, each sending its
#       own batch of N (reward_tools.bench_clients), against each row of RAY_ROWS (default "1 2
#       list"): Ray Serve with 1 and with 2 replicas (one GPU each), and two plain servers behind
#       the client's replica list; then one table against the 1-replica row. Needs 2 GPUs and Ray
#       (scripts/gpu/prepare_ray_carry.sh); ~2.5 min a row with STYLES=logprob.
# chat: OpenAI chat requests (reward_tools.bench_chat) of the seed worker's shape (8 JPEG frames,
#       N_SEED=64 concurrent) and RLinf's history-buffer shape (5 frames x 2 views, N_HISTORY=512
#       concurrent), to this server's /v1/chat/completions and then to plain `vllm serve` on the
#       same checkpoint and engine settings, one after the other on one GPU; each warmed by an
#       unmeasured pass of its own frames, then CHAT_REPEATS (3) repeats of frames never sent
#       before, medians compared (table_chat.md); peak RSS of each.
# curves: progress curves (reward_tools.bench_curves): N episodes ending together scored with K = 1,
#       8, 16 points through the hook's raw batch, median of 3, per server setting of CURVE_ROWS
#       (default "today default": the settings before issue 33, then this server's defaults) and
#       style of CURVE_STYLES (default "logprob"; gen32: 32 new tokens per point); per K the wall
#       time, the computed-token ratio and the wall/token ratio (reward_tools.curves_table).
#       One GPU, ~2-3 min a row.
set -euo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CKPT=/tmp/ckpt7b
[ -f $CKPT/config.json ] || python3 -m reward_server.tiny_checkpoint $CKPT --preset qwen2_5_vl_7b >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# the host's CPU too: the server's input processing runs there, and two H200 hosts gave K = 16 curves
# 4.8-5.3 s and 6.3-6.8 s with nearly the same tree (issue 40's rounds 10 and 11)
{ lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|CPU max MHz)'; nproc; } >"$OUT/host.txt" 2>/dev/null || true
TUNED="--max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN"
COMMON="--model-path $CKPT --dtype bfloat16 --max-model-len 8192 --log-level warning --gpu-memory-utilization 0.85"
N=${N:-64}
STYLES=${STYLES:-logprob gen256}

wait_http() {  # url, seconds
  for _ in $(seq "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done
  echo "not ready: $1" >&2; return 1
}

wait_server() {  # url, pid, seconds: /health ok, or fail as soon as the server exits
  for _ in $(seq "$3"); do
    curl -sf "$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "server exited: $1" >&2; return 1; }
    sleep 1
  done
  echo "not ready: $1" >&2; return 1
}

wait_replicas() {  # url, replicas, seconds: /health ok from that many distinct Ray Serve replicas
  python3 - "$@" <<'PY'
import sys
import time

import httpx

url, want, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
seen, end = set(), time.monotonic() + limit
while len(seen) < want and time.monotonic() < end:
    try:
        r = httpx.get(f"{url}/health", timeout=5)
        if r.status_code == 200:
            seen.add(r.headers.get("x-reward-replica"))
    except httpx.HTTPError:
        pass
    time.sleep(0.3)
sys.exit(0 if len(seen) >= want else f"{len(seen)} of {want} replicas ready at {url}")
PY
}

stop_pid() {  # SIGTERM, wait (the server drains, vLLM frees the GPU)
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

peak_rss() {  # pid: the process's peak resident memory (VmHWM), children not included
  grep VmHWM "/proc/$1/status" 2>/dev/null || echo "VmHWM: unknown"
}

case "${1:?vllm, hf, split, warmup, ceiling, ray, chat or curves}" in
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
      --repeats 3 --out "$OUT/raw_hf.json" 2>"$OUT/raw_hf.log"
    python3 -m reward_tools.bench --launch "$COMMON --engine hf --max-batch-size $N" --n "$N" --styles $STYLES \
      --paths hook_raw --repeats 3 --out "$OUT/server_hf.json" 2>"$OUT/server_hf.log"
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
      --repeats 3 --out "$OUT/split_1.json" 2>"$OUT/split_bench_1.log"
    python3 -m reward_tools.bench --url http://127.0.0.1:18080,http://127.0.0.1:18081 --n 64 128 --styles $STYLES \
      --paths hook_raw --repeats 3 --out "$OUT/split_2.json" 2>"$OUT/split_bench_2.log"
    python3 -m reward_tools.bench_report "$OUT"/split_1.json "$OUT"/split_2.json | tee "$OUT/table_split.md"
    ;;
  warmup)
    style=${STYLES%% *}
    rows=()
    for row in ${WARMUP_ROWS:-off on full}; do
      case $row in
        off) flags="--no-warmup" ;;
        on) flags="--warmup" ;;
        full) flags="--warmup --warmup-batch $N" ;;
        *) echo "unknown warm-up row $row (off, on, full)" >&2; exit 2 ;;
      esac
      python3 -m reward_tools.bench --launch "$COMMON --engine vllm $TUNED $flags" --first-batch --n "$N" \
        --styles "$style" --repeats 3 --out "$OUT/first_$row.json" >"$OUT/first_$row.txt" 2>"$OUT/first_$row.log"
      rows+=("$OUT/first_$row.json")
    done
    python3 - "${rows[@]}" <<'PY' | tee "$OUT/table_warmup.md"
import json
import sys
from pathlib import Path

print("| warm-up | style | N | first batch s | steady s (median) | first / steady | warm-up s |")
print("|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    r = json.loads(Path(path).read_text())["first_batch"]
    w = r.get("warmup") or {}
    print(f"| {Path(path).stem[6:]} ({w.get('episodes', 0)} episodes) | {r['style']} | {r['n']} | {r['first_s']:.2f} | "
          f"{r['steady_median_s']:.2f} | {r['first_over_steady']:.2f} | {w.get('seconds', 0):.1f} |")
PY
    ;;
  ceiling)
    url=http://127.0.0.1:18080
    done_settings=()
    for name in ${CEILING:-bf16 fp8 fp8kv compile}; do
      case $name in
        bf16) flags="" ;;
        fp8) flags="--quantization fp8" ;;
        fp8kv) flags="--quantization fp8 --kv-cache-dtype fp8" ;;
        kv8) flags="--kv-cache-dtype fp8" ;;
        encoder) flags="--compile-mm-encoder --cudagraph-mm-encoder" ;;
        compile) flags="--compile-mm-encoder" ;;
        *) echo "unknown setting $name (bf16, fp8, fp8kv, kv8, encoder, compile)" >&2; exit 2 ;;
      esac
      # shellcheck disable=SC2086  # flag lists
      python3 -m reward_server $COMMON --engine vllm $TUNED $flags --port 18080 >"$OUT/ceiling_$name.server.log" 2>&1 &
      pid=$!
      if ! wait_server $url $pid 900; then
        tail -5 "$OUT/ceiling_$name.server.log" >&2; stop_pid $pid; continue
      fi
      python3 -m reward_tools.bench --url $url --n "$N" --styles $STYLES --paths hook_raw --repeats 3 \
        --out "$OUT/ceiling_$name.json" 2>"$OUT/ceiling_$name.log" || echo "$name: errors (see its log)" >&2
      if [ "$name" = bf16 ]; then
        python3 -m reward_tools.bench --url $url --n "$N" --styles $STYLES --paths hook_raw --repeats 3 --to-grid \
          --out "$OUT/ceiling_bf16_grid.json" 2>"$OUT/ceiling_bf16_grid.log" || echo "bf16 --to-grid: errors" >&2
      fi
      python3 -m reward_tools.fidelity scores --url $url --n "$N" --out "$OUT/scores_$name.json" \
        >/dev/null 2>>"$OUT/ceiling_$name.log" || echo "$name: no fidelity scores" >&2
      stop_pid $pid
      done_settings+=("$name")
    done
    python3 -m reward_tools.bench_report "$OUT"/ceiling_*.json | tee "$OUT/table_ceiling.md"
    for name in "${done_settings[@]}"; do
      [ "$name" != bf16 ] && [ -f "$OUT/scores_bf16.json" ] || continue
      python3 -m reward_tools.fidelity compare "$OUT/scores_bf16.json" "$OUT/scores_$name.json" \
        --out "$OUT/fidelity_$name.json" >/dev/null
      python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], 'vs bf16: spearman', r['spearman'], 'max |diff|', r['max_abs_diff'], 'mean |diff|', r['mean_abs_diff'])" \
        "$OUT/fidelity_$name.json" "$name" | tee -a "$OUT/table_ceiling.md"
    done
    ;;
  ray)
    url=http://127.0.0.1:18080
    files=()
    for row in ${RAY_ROWS:-1 2 list}; do
      case $row in
        list)
          pids=()
          for gpu in 0 1; do
            # shellcheck disable=SC2086  # flag lists
            python3 -m reward_server $COMMON --engine vllm $TUNED --gpu-ids $gpu --port 1808$gpu \
              >"$OUT/list_server_$gpu.log" 2>&1 &
            pids+=($!)
          done
          if ! { wait_server http://127.0.0.1:18080 "${pids[0]}" 900 && wait_server http://127.0.0.1:18081 "${pids[1]}" 900; }; then
            tail -5 "$OUT"/list_server_*.log >&2; for pid in "${pids[@]}"; do stop_pid "$pid"; done; continue
          fi
          # shellcheck disable=SC2086  # CLIENTS and STYLES are lists
          python3 -m reward_tools.bench_clients --url http://127.0.0.1:18080,http://127.0.0.1:18081 --clients ${CLIENTS:-2 4} \
            --n "$N" --styles $STYLES --out "$OUT/list_2.json" >/dev/null 2>"$OUT/list_bench.log" || echo "list: errors" >&2
          for pid in "${pids[@]}"; do stop_pid "$pid"; done
          [ -f "$OUT/list_2.json" ] && files+=("$OUT/list_2.json")
          ;;
        *)
          # shellcheck disable=SC2086  # flag lists
          python3 -m reward_server serve-ray --num-replicas "$row" --gpus-per-replica 1 --cpus-per-replica 4 \
            $COMMON --engine vllm $TUNED --port 18080 >"$OUT/ray_$row.log" 2>&1 &
          ray_pid=$!
          if ! { wait_server $url $ray_pid 900 && wait_replicas $url "$row" 900; }; then
            tail -20 "$OUT/ray_$row.log" >&2; stop_pid $ray_pid; continue
          fi
          # shellcheck disable=SC2086  # CLIENTS and STYLES are lists
          python3 -m reward_tools.bench_clients --url $url --replicas "$row" --clients ${CLIENTS:-2 4} --n "$N" --styles $STYLES \
            --out "$OUT/ray_$row.json" >/dev/null 2>"$OUT/ray_bench_$row.log" || echo "ray $row: errors" >&2
          stop_pid $ray_pid  # serve-ray shuts Serve and its local Ray cluster down
          [ -f "$OUT/ray_$row.json" ] && files+=("$OUT/ray_$row.json")
          ;;
      esac
    done
    [ ${#files[@]} -gt 0 ] || { echo "no ray row ran" >&2; exit 1; }
    python3 -m reward_tools.bench_report "${files[@]}" | tee "$OUT/table_ray.md"
    ;;
  chat)
    # each server: one unmeasured warm-up pass per shape with its own frames (CHAT_WARMUP_N requests
    # each), then CHAT_REPEATS measured repeats of frames never sent before; medians compared.
    # CHAT_SIDES (default "server vllm_serve") runs one side per call where a call's time limit
    # cannot hold both; then `python -m reward_tools.bench_chat --report` the two JSON files.
    SHAPES="--shape seed --n ${N_SEED:-64} --shape history --n ${N_HISTORY:-512}"
    SHAPES="$SHAPES --repeats ${CHAT_REPEATS:-3} --warmup-n ${CHAT_WARMUP_N:-64}"
    SEQS="--max-num-seqs 256"  # both servers schedule the same number of requests at once
    for side in ${CHAT_SIDES:-server vllm_serve}; do
      case $side in
        server)
          python3 -m reward_server $COMMON --engine vllm $TUNED $SEQS --max-images-per-request 16 --port 18080 \
            >"$OUT/chat_server.log" 2>&1 &
          url=http://127.0.0.1:18080 ;;
        vllm_serve)  # plain `vllm serve`, same engine settings and image limit; the same payloads
          python3 -m vllm.entrypoints.openai.api_server --model $CKPT --dtype bfloat16 --max-model-len 8192 \
            --gpu-memory-utilization 0.85 $TUNED $SEQS --limit-mm-per-prompt '{"image": 16, "video": 1}' \
            --port 18000 >"$OUT/chat_vllm_serve.log" 2>&1 &
          url=http://127.0.0.1:18000 ;;
        *) echo "unknown chat side $side (server, vllm_serve)" >&2; exit 2 ;;
      esac
      pid=$!
      trap 'kill $pid 2>/dev/null || true' EXIT
      wait_server $url $pid 900
      python3 -m reward_tools.bench_chat --url $url $SHAPES --out "$OUT/chat_$side.json" \
        2>"$OUT/chat_bench_$side.log"
      peak_rss $pid >"$OUT/chat_${side}_rss.txt"
      curl -s $url/metrics >"$OUT/chat_${side}_metrics.txt" || true
      stop_pid $pid
    done
    if [ -f "$OUT/chat_server.json" ] && [ -f "$OUT/chat_vllm_serve.json" ]; then
      python3 -m reward_tools.bench_chat --report "$OUT"/chat_server.json "$OUT"/chat_vllm_serve.json \
        | tee "$OUT/table_chat.md"
    fi
    ;;
  curves)
    # CURVE_ROWS: server settings, one server each: `today` (as before issue 33: --max-num-seqs 128,
    # content hashes, no processor cache, the shorter points after the longest's first output),
    # `default` (this server's defaults), `nocache` (default without vLLM's processor cache),
    # `prefilled` (default, the shorter points after the longest's first output), `seqs128`,
    # `seqs512`; CURVE_FLAGS_<name> adds a row of your own. CURVE_PLAIN=1 adds the plain way,
    # CURVE_VOC=1 the VOC curves.
    declare -A ROWFLAGS=(
      [today]="--max-num-seqs 128 --engine-option curve_start=prefilled --engine-option curve_clip_ids=false"
      [default]=""
      [nocache]="--engine-option mm_processor_cache_gb=0"
      [prefilled]="--engine-option curve_start=prefilled"
      [seqs128]="--max-num-seqs 128"
      [seqs512]="--max-num-seqs 512"
    )
    for style in ${CURVE_STYLES:-logprob}; do
      for row in ${CURVE_ROWS:-today default}; do
        var="CURVE_FLAGS_$row"
        flags=${!var-${ROWFLAGS[$row]-}}
        extra=""
        [ "${CURVE_PLAIN:-0}" = 1 ] || extra+=" --no-plain"
        [ "${CURVE_VOC:-0}" = 1 ] || extra+=" --no-voc"
        python3 -m reward_tools.bench_curves --launch "$COMMON --engine vllm $TUNED $flags" --n "$N" \
          --points ${CURVE_POINTS:-1 8 16} --repeats "${CURVE_REPEATS:-3}" --style "$style" $extra \
          --out "$OUT/curves_${style}_$row.json" >/dev/null 2>"$OUT/curves_${style}_$row.log" \
          || echo "row $row failed: see curves_${style}_$row.log"
      done
    done
    python3 -m reward_tools.curves_table "$OUT"/curves_*.json | tee "$OUT/table_curves.md"
    ;;
esac
