#!/usr/bin/env bash
# Run the A/B/C comparison (and D) against a patched RLinf checkout, main or v0.3, one run after another.
#
#   bash scripts/run_experiments.sh RLINF_DIR --qwen-model DIR --primo-model DIR [--env libero|starvla|maniskill] \
#        [--suite libero_spatial|libero_10] [--runs A,B,C] [--qwen3-model DIR] [--reward-gpus 6,7] [--port 18080] \
#        [--out experiments/<date>] [-- OVERRIDE...]
#
# Run B3 is run B with a Qwen3-VL judge (<prefix>_runB3_qwen3, backend qwen3_vl, --qwen3-model DIR):
# --runs A,B,B3,C for the comparison with both judges. Run C's server runs PRIMO_BACKEND (default PRIMO-R1).
# --env picks the run configs: libero (default) libero_10_grpo_openvlaoft_run{A,B_qwen,C_primo} and
# run D, libero_10_ppo_openvlaoft_runD_dense (PPO on the Qwen judge's progress curves: --runs A,B,C,D);
# starvla (RLinf main only) <suite>_grpo_starvla_run{A,B_qwen,C_primo}, StarVLA QwenOFT on
# --suite libero_spatial (default) or libero_10; maniskill maniskill_ppo_mlp_run{A,B_qwen,C_primo}
# (one training GPU: --reward-gpus 1). Which RLinf RLINF_DIR is, main or v0.3, is read from its code
# (apply_rlinf_patches.sh --which); both versions' configs have the same names.
#
# For run B, C and D it starts the matching reward server on --reward-gpus (kept apart from
# RLinf's placement, GPUs 0-3 in the LIBERO run configs), runs
# `examples/embodiment/run_embodiment.sh <config>` while the server loads (RLinf's reward client
# waits for it), stops the run if the server exits or is not healthy within HEALTH_TIMEOUT_S
# (default 1800), and stops the server whatever happened.
# Every run keeps its own reward-server log and RLinf console log under --out; RLinf's own
# logs (TensorBoard) go to RLINF_DIR/logs/<timestamp>-<config> as usual, and the path is
# recorded in --out/<run>/log_path, the server's /metrics at the end of the run in
# --out/<run>/server_metrics.txt. Extra server flags: REWARD_SERVER_FLAGS="...".
# Hydra overrides after `--` go to every run (one written RUN:KEY=VALUE, e.g. D:algorithm.update_epoch=1 or B3:...,
# to that run only): run_embodiment.sh takes none, so the script then
# starts train_embodied_agent.py itself exactly as run_embodiment.sh does, plus the overrides
# (and the reward server's URL for B/C), with RLINF_PYTHON (default: python), under
# RUN_TIMEOUT_S if set (a dead Ray worker can hang the driver).
# Afterwards: python -m reward_tools.compare_runs --run A=... --run B=... --run C=... (printed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
exec 3>&2  # the script's own stderr, for what it says while a run's output goes to its console log
die() { echo "run_experiments: $*" >&2; exit 1; }
log() { echo "[run_experiments] $*" >&2; }

[ $# -ge 1 ] || die "usage: $0 RLINF_DIR --qwen-model DIR --primo-model DIR [--qwen3-model DIR] [--env libero|starvla|maniskill] [--runs A,B,B3,C,D] [--reward-gpus 6,7] [--port 18080] [--out DIR]"
RLINF_DIR=$(cd "$1" && pwd) || die "no such directory: $1"
shift
env_name=libero; suite=libero_spatial; runs=A,B,C; reward_gpus=6,7; port=18080; qwen=""; primo=""; qwen3=""; out="$ROOT/experiments/$(date +%Y%m%d-%H%M%S)"
health_timeout=${HEALTH_TIMEOUT_S:-1800}
while [ $# -gt 0 ]; do
  case "$1" in
    --env) env_name=$2; shift 2 ;;
    --suite) suite=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --reward-gpus) reward_gpus=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --qwen-model) qwen=$2; shift 2 ;;
    --primo-model) primo=$2; shift 2 ;;
    --qwen3-model) qwen3=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1'" ;;
  esac
done
overrides=("$@")

version=$(bash "$ROOT/scripts/apply_rlinf_patches.sh" "$RLINF_DIR" --which) || exit 1
bash "$ROOT/scripts/apply_rlinf_patches.sh" "$RLINF_DIR" --check >/dev/null \
  || die "$RLINF_DIR (RLinf $version) is not patched: bash scripts/apply_rlinf_patches.sh $RLINF_DIR"
launcher="$RLINF_DIR/examples/embodiment/run_embodiment.sh"
[ -f "$launcher" ] || die "no $launcher"
IFS=, read -r -a run_list <<<"$runs"
for run in "${run_list[@]}"; do
  case "$run" in
    A) ;; B | D) [ -n "$qwen" ] || die "run $run needs --qwen-model" ;; C) [ -n "$primo" ] || die "run C needs --primo-model" ;;
    B3) [ -n "$qwen3" ] || die "run B3 needs --qwen3-model (a Qwen3-VL Instruct checkpoint)" ;;
    *) die "unknown run '$run' (A, B, B3, C or D)" ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

server_pid=""
server_metrics=""
server_log=""
server_deadline=0
server_healthy=0
rlinf_sid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    # what the server counted (requests per route, episodes, batch sizes) outlives it
    [ -z "$server_metrics" ] || curl -s "http://127.0.0.1:$port/metrics" >"$server_metrics" || true
    log "stopping reward server (pid $server_pid)"
    kill -TERM -- "-$server_pid" 2>/dev/null || kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
stop_rlinf() {  # whatever the run left behind (Ray's processes) in its own session
  [ -n "$rlinf_sid" ] || return 0
  pkill -KILL -s "$rlinf_sid" 2>/dev/null || true
  for _ in $(seq 1 40); do pgrep -s "$rlinf_sid" >/dev/null || break; sleep 0.5; done
  rlinf_sid=""
}
cleanup() { stop_rlinf; stop_server; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# The server loads while RLinf starts (Ray, its workers, the simulator): RLinf's reward client
# waits for /health (reward_model.wait_ready_s) before its first episode ends. watch_server stops
# the run if the server exits or is not healthy within HEALTH_TIMEOUT_S.
start_server() {  # backend model logfile
  log "starting reward server: --backend $1 --model-path $2 --gpu-ids $reward_gpus --port $port ${REWARD_SERVER_FLAGS:-}"
  # shellcheck disable=SC2086  # REWARD_SERVER_FLAGS is a list of flags
  setsid "$PY" -m reward_server --backend "$1" --model-path "$2" --gpu-ids "$reward_gpus" \
    --port "$port" ${REWARD_SERVER_FLAGS:-} >"$3" 2>&1 3>&- &
  server_pid=$!
  server_metrics="$run_out/server_metrics.txt"
  server_log=$3
  server_deadline=$((SECONDS + health_timeout))
  server_healthy=0
}
watch_server() {  # once per poll while RLinf runs, until the server is healthy
  [ -n "$server_pid" ] && [ "$server_healthy" = 0 ] || return 0
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
    server_healthy=1
    log "reward server healthy: $(curl -s "http://127.0.0.1:$port/health")"
    return 0
  fi
  kill -0 "$server_pid" 2>/dev/null || { tail -20 "$server_log" >&2; die "reward server exited during startup (log: $server_log)"; }
  [ $SECONDS -lt "$server_deadline" ] || die "reward server not healthy after ${health_timeout}s (log: $server_log)"
}

run_rlinf() {  # run config: RLinf's launcher, or its entry point when there are overrides
  local mine=() item
  for item in "${overrides[@]}"; do  # RUN:KEY=VALUE goes to that run alone
    if [[ $item =~ ^(A|B|B3|C|D):(.*)$ ]]; then
      [ "${BASH_REMATCH[1]}" != "$1" ] || mine+=("${BASH_REMATCH[2]}")
    else
      mine+=("$item")
    fi
  done
  if [ ${#mine[@]} -eq 0 ]; then
    (cd "$RLINF_DIR" && exec setsid bash examples/embodiment/run_embodiment.sh "$2") 3>&- &
    await_rlinf
    return
  fi
  local extra=()
  [ "$1" = A ] || extra=("env.train.reward_model.url=http://127.0.0.1:$port")
  # the environment and arguments run_embodiment.sh gives train_embodied_agent.py
  local embodied="$RLINF_DIR/examples/embodiment"
  local log_dir
  log_dir="$RLINF_DIR/logs/$(date +'%Y%m%d-%H:%M:%S')-$2"
  mkdir -p "$log_dir"
  local timeout=()
  [ -z "${RUN_TIMEOUT_S:-}" ] || timeout=(timeout -k 30 "$RUN_TIMEOUT_S")
  (
    cd "$RLINF_DIR"
    export EMBODIED_PATH="$embodied" REPO_PATH="$RLINF_DIR" PYTHONPATH="$RLINF_DIR${PYTHONPATH:+:$PYTHONPATH}"
    export MUJOCO_GL=${MUJOCO_GL:-egl} PYOPENGL_PLATFORM=${PYOPENGL_PLATFORM:-egl}
    export ROBOT_PLATFORM=${ROBOT_PLATFORM:-LIBERO} LIBERO_TYPE=${LIBERO_TYPE:-standard}
    exec setsid "${timeout[@]}" "${RLINF_PYTHON:-python}" "$embodied/train_embodied_agent.py" \
      --config-path "$embodied/config/" --config-name "$2" runner.logger.log_path="$log_dir" \
      "${mine[@]}" "${extra[@]}"
  ) 3>&- &
  await_rlinf
}
await_rlinf() {  # the RLinf just started in the background, in a session of its own
  rlinf_sid=$!
  while kill -0 "$rlinf_sid" 2>/dev/null; do
    watch_server 2>&3
    sleep 1
  done
  local rc=0
  wait "$rlinf_sid" || rc=$?
  stop_rlinf
  return $rc
}

case "$env_name" in
  libero) prefix=libero_10_grpo_openvlaoft ;;
  starvla)
    [ "$version" = main ] || die "StarVLA runs need RLinf main ($RLINF_DIR is RLinf $version)"
    case "$suite" in libero_spatial | libero_10) ;; *) die "unknown suite '$suite' (libero_spatial or libero_10)" ;; esac
    prefix=${suite}_grpo_starvla ;;
  maniskill) prefix=maniskill_ppo_mlp ;;
  *) die "unknown env '$env_name' (libero, starvla or maniskill)" ;;
esac
declare -A config=([A]=${prefix}_runA [B]=${prefix}_runB_qwen [B3]=${prefix}_runB3_qwen3 [C]=${prefix}_runC_primo)
if [ "$env_name" = libero ]; then config[D]=libero_10_ppo_openvlaoft_runD_dense; fi
for run in "${run_list[@]}"; do
  [ -n "${config[$run]:-}" ] || die "run $run has no $env_name config (run D: --env libero)"
  [ -f "$RLINF_DIR/examples/embodiment/config/${config[$run]}.yaml" ] \
    || die "no ${config[$run]}.yaml in $RLINF_DIR/examples/embodiment/config (bash scripts/apply_rlinf_patches.sh $RLINF_DIR)"
done
summary=()
status=0
for run in "${run_list[@]}"; do
  run_out="$out/run$run"
  mkdir -p "$run_out"
  case "$run" in
    B | D) start_server qwen2_5_vl_vllm "$qwen" "$run_out/reward_server.log" ;;
    B3) start_server qwen3_vl "$qwen3" "$run_out/reward_server.log" ;;
    C) start_server "${PRIMO_BACKEND:-PRIMO-R1}" "$primo" "$run_out/reward_server.log" ;;
  esac
  before=$(ls -1d "$RLINF_DIR"/logs/*-"${config[$run]}" 2>/dev/null || true)
  log "run $run: ${config[$run]} (console log: $run_out/console.log)"
  set +e
  run_rlinf "$run" "${config[$run]}" >"$run_out/console.log" 2>&1
  rc=$?
  set -e
  stop_server
  log_path=$(comm -13 <(echo "$before") <(ls -1d "$RLINF_DIR"/logs/*-"${config[$run]}" 2>/dev/null || true) | tail -1)
  echo "${log_path:-unknown}" >"$run_out/log_path"
  if [ $rc -ne 0 ]; then
    log "run $run FAILED (exit $rc); see $run_out/console.log"
    status=1
  else
    log "run $run done: $log_path"
    summary+=("--run $run=$log_path")
  fi
done
if [ ${#summary[@]} -gt 0 ]; then
  log "compare: PYTHONPATH=$ROOT $PY -m reward_tools.compare_runs ${summary[*]} --out $out/compare"
fi
exit $status
