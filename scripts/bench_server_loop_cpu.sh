#!/usr/bin/env bash
# The reward server's event-loop thread CPU per hook batch (64 episodes, 192 MiB raw batch), fake
# engine, this machine: what receiving and dispatching a batch costs the thread that reads bodies.
#   bash scripts/bench_server_loop_cpu.sh [TREE]      TREE: run the server from another tree's packages
# Prints the bench's table row and the main thread's user and system CPU per batch (/proc).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-18191}
TREE=${1:-$PWD}
PYTHONPATH=$TREE${PYTHONPATH:+:$PYTHONPATH} python -P -m reward_server --engine fake --host 127.0.0.1 --port "$PORT" \
  --log-level warning >/dev/null 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.5; done
cpu() { awk '{print $14, $15}' "/proc/$PID/task/$PID/stat"; }
python -m reward_tools.bench --url "http://127.0.0.1:$PORT" --paths hook_raw --n 64 --styles logprob --repeats 1 \
  --out /dev/null >/dev/null 2>&1   # warm
read -r u0 s0 < <(cpu)
python -m reward_tools.bench --url "http://127.0.0.1:$PORT" --paths hook_raw --n 64 --styles logprob --repeats 8 \
  --out /dev/null 2>/dev/null | tail -1
read -r u1 s1 < <(cpu)
tick=$(getconf CLK_TCK)
# 9 batches: the bench's own warm-up batch and its 8 repeats
echo "event loop thread per batch: user $(( (u1 - u0) * 1000 / tick / 9 )) ms, system $(( (s1 - s0) * 1000 / tick / 9 )) ms"
