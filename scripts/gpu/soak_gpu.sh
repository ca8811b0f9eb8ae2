#!/usr/bin/env bash
# Issue 42's GPU soak (reward_tools.soak) at 7B shapes on a lent GPU, after scripts/gpu/stage_vllm.sh.
# The soak outlives one device call (10 minutes at most), so it runs in its own process session and
# later calls wait for it; the machine is given back after 30 minutes held, so stage, start and
# wait back to back:
#
#   bash scripts/gpu/soak_gpu.sh start    # starts the soak (SOAK_MIN minutes, default 20.5), waits ~9 min
#   bash scripts/gpu/soak_gpu.sh wait     # waits up to ~9.5 min more, printing progress
#   bash scripts/gpu/soak_gpu.sh collect  # waits for the end; the JSON, PNG and logs come back in $OUT
#                                         # (STOP=1: ends the soak now, SIGUSR1; it still reports)
#
# Workload (as the first GPU soak of issue 42): 4 env workers x 16 envs, 16 frames of 256x256,
# logprob, the server restarted at SOAK_RESTARTS minutes (default 4,8,12,16: SIGTERM to the
# process group, then SIGKILL to it, in turn), cut, stalled, huge and bad requests on schedule.
set -euo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
RES=/tmp/res/soak
mkdir -p "$OUT" "$RES"
CKPT=/tmp/ckpt7b
LAUNCH="--engine vllm --model-path $CKPT --dtype bfloat16 --max-model-len 8192 --gpu-memory-utilization 0.85"
LAUNCH="$LAUNCH --max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN --warmup-batch 64 --log-level warning"

progress() {
  tail -c 2000 "$RES/soak.log" | grep -E "lifetime|episodes|ERROR|Traceback" | tail -5 || true
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
}

wait_for() {  # seconds: until the soak's process ends or the time is up
  local until=$((SECONDS + $1))
  while [ $SECONDS -lt $until ]; do
    [ -f "$RES/done" ] && return 0
    sleep 15
  done
  return 0
}

case "${1:?start, wait or collect}" in
  start)
    [ -f $CKPT/config.json ] || python3 -m reward_server.tiny_checkpoint $CKPT --preset qwen2_5_vl_7b >/dev/null
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$RES/gpu.txt"
    rm -f "$RES/done"
    setsid bash -c "python3 -m reward_tools.soak --launch '$LAUNCH' --minutes ${SOAK_MIN:-20.5} --workers 4 --envs 16 \
      --size 256 --nframes 16 --restart-at-min ${SOAK_RESTARTS:-4,8,12,16} \
      --note 'one H200, vLLM 0.24, Qwen2.5-VL-7B shapes with random weights' \
      --out $RES/gpu_soak.json >$RES/soak.log 2>&1 & echo \$! >$RES/soak.pid; wait \$!; echo \$? >$RES/done" \
      </dev/null >/dev/null 2>&1 &
    wait_for "${WAIT_S:-540}"
    progress
    ;;
  wait)
    wait_for "${WAIT_S:-570}"
    progress
    ;;
  collect)
    if [ "${STOP:-0}" = 1 ] && [ ! -f "$RES/done" ]; then  # end it now: the soak still writes its report
      kill -USR1 "$(cat "$RES/soak.pid")" 2>/dev/null || true
    fi
    wait_for "${WAIT_S:-570}"
    progress
    [ -f "$RES/done" ] && echo "soak exit $(cat "$RES/done")" || echo "soak still running"
    cp "$RES"/gpu_soak.json "$RES"/gpu_soak.png "$RES"/gpu.txt "$OUT"/ 2>/dev/null || true
    tar czf "$OUT/soak_logs.tgz" -C "$RES" . 2>/dev/null || true
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({k: v for k, v in r.items() if k not in ('samples', 'latency', 'events')}, indent=1)[:6000])" \
      "$RES/gpu_soak.json" 2>/dev/null || true
    ;;
  *) echo "start, wait or collect" >&2; exit 2 ;;
esac
