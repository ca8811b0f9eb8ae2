#!/usr/bin/env bash
# Issue 40's profiles on a lent GPU (device tool), after scripts/gpu/stage_vllm.sh: where a batch of
# N = 64 episodes (16 frames of 256x256) ending together spends its time, from the server's
# per-episode engine stages and vLLM's own step log (reward_tools.steps_report), 7B shapes.
#
#   bash scripts/gpu/profile_gpu.sh primo|primo_raw|k1_raw|k1_trace|k1_trace_server|k1|curves|curves_ab|curves_spy|curve_feed|input_cost|ab|judges
#   (results under $RES, packed into $OUT)
#
# judges:    the judges of JUDGES (default "qwen2_5_vl_7b qwen3_vl_4b qwen3_vl_8b": tiny_checkpoint presets,
#            random weights at the released shapes, built here), each on its shipped preset
#            (configs/server/JUDGE.yaml, --gpu-ids 0), one server each in turn: the hook path K = 1 in
#            logprob and p_true (median of REPEATS, 5), then on the same server curves K = 1, 8, 16 in
#            both (CURVE_REPEATS, 3): Qwen3-VL's rows beside Qwen2.5-VL-7B's, p_true's cost against logprob's.
# primo:     the PRIMO-R1 profile (run C's judge) on the hook path, exactly 1 (the prefill alone),
#            256 and 1024 new tokens (PRIMO_STYLES), median of 3 each; the phases table and the goal (gen256 within
#            1.2x of gen1 + 256 decode steps). PRIMO_FLAGS: more server flags (a setting to check).
# primo_raw: the same prompts on the bare engine (LLM.generate), gen1 and gen256.
# k1_raw:    the same prompts on the bare engine (LLM.generate, inputs in memory), logprob.
# k1_trace:  k1_raw, then one batch traced by vLLM's torch profiler: the GPU's busy time, the vision
#            encoder's share, the idle gaps (reward_tools.gpu_trace; RAW_FLAGS, TRACE_NAME).
# k1_trace_server: the server's hook path K = 1 (SERVER_FLAGS, REPEATS), then one more batch traced
#            by vLLM's torch profiler in its engine (`--engine-option profile_dir`, `bench --trace`):
#            where the GPU waits on the path users run, where requests stream in (TRACE_NAME).
# k1:        the Qwen profile, logprob (the hook path K = 1), median of REPEATS (5). SPY=1: py-spy
#            samples the server and its engine core while the bench runs (k1_spy.txt, collapsed
#            stacks per thread), to see what holds the interpreter.
# curves:    progress curves K = 1, 8, 16 (reward_tools.bench_curves, CURVE_REPEATS, default 4),
#            every repeat's phases (why repeats differ). CURVE_FLAGS: more server flags; CURVE_POINTS
#            ("1 16"), CURVE_STYLE (gen1: PRIMO-R1's curves, one new token a point).
# curves_ab: the curves K = 1, 8, 16 (CURVE_REPEATS, default 3) on a server of each row of AB_ROWS
#            (as ab: name=flags, "@DIR" and NAME=VALUE words too), the rows in turn, AB_ROUNDS
#            times (default 1): two settings or two trees' curves side by side on one machine.
# curves_spy: curves K = 1, 8 (SPY_POINTS) on a server of CURVE_FLAGS, sampled by py-spy (SPY_NAME names the result).
# curve_feed: each row of FEED_ROWS (name=flags;...; default one row, --compile-mm-encoder) on one
#            engine without the HTTP layer: the curves K = 1 and 16 (FEED_POINTS) through the server's
#            path against every input processed first and all handed to vLLM at once
#            (reward_tools/benchmarks/curve_feed.py, FEED_REPEATS, default 3): is the batch held back by its feed.
# input_cost: one input thread's processing per 16-point curve here, nothing else running
#            (reward_tools/benchmarks/input_processing.py --points 16 --raw-pixels --ab INPUT_ROWS): the host and
#            vLLM's version against the CPU machine's numbers, settings of the input side side by side.
# ab:        each row of AB_ROWS (name=flags, ';'-separated, e.g. "base=;threads16=--engine-option
#            preprocess_threads=16"; flags "@DIR ..." run that row's server from the tree at DIR, and
#            "NAME=VALUE ..." with that environment) on
#            the hook path, STYLES (logprob), median of REPEATS (3), one server per row in turn,
#            then the rows again in the same order (AB_ROUNDS, default 2), so each row is measured
#            warm, twice, on episodes never sent before. FIDELITY_GEN=K: each row also answers the
#            same N episodes with exactly K greedy tokens, compared with the first row's answers
#            (reward_tools.fidelity: how many texts are the same).
set -euo pipefail
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
RES=${RES:-/tmp/res}
mkdir -p "$OUT" "$RES"
CKPT=/tmp/ckpt7b
[ -f $CKPT/config.json ] || python3 -m reward_server.tiny_checkpoint $CKPT --preset qwen2_5_vl_7b >/dev/null
# SERVER_BASE: every server's flags instead of the rounds' engine flags below, e.g. a preset as the
# README starts it ("--config configs/server/qwen2_5_vl_7b.yaml --model-path /tmp/ckpt7b --gpu-ids 0";
# scripts/gpu/measure_issue57.sh). Since the encoder switches became the GPU default, every row below
# runs with --compile-mm-encoder --cudagraph-mm-encoder unless its flags say --no-...
COMMON="--engine vllm --model-path $CKPT --dtype bfloat16 --max-model-len 8192 --log-level warning"
COMMON="$COMMON --gpu-memory-utilization 0.85 --max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN"
COMMON=${SERVER_BASE:-$COMMON}
N=${N:-64}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$RES/gpu.txt"
# the host's CPU too: the server's input processing runs there, and two H200 hosts gave K = 16 curves
# 4.8-5.3 s and 6.3-6.8 s with nearly the same tree (issue 40's rounds 10 and 11)
{ lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|CPU max MHz)'; nproc; } >"$RES/host.txt" 2>/dev/null || true

wait_server() {  # url, pid, seconds: /health ok, or fail as soon as the server exits
  for _ in $(seq "$3"); do
    curl -sf "$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "server exited: $1" >&2; return 1; }
    sleep 1
  done
  echo "not ready: $1" >&2; return 1
}

URL=http://127.0.0.1:18080
SERVER_PID="" SPY_PID=""

server_up() {  # name, server flags: a server on $URL logging its engine steps to $RES/NAME_steps.jsonl
  # flags that start with @DIR run the server from the tree at DIR instead of this one (an earlier
  # commit's packages, `git archive COMMIT reward_server reward_client | tar x -C DIR`, carried):
  # a code change measured side by side with what it replaces, the client and bench the same
  # (-P: the working directory is not put first on the path, so DIR's packages are the ones found)
  # then leading NAME=VALUE words are that server's environment (e.g. OMP_NUM_THREADS=1), the client's unchanged;
  # VLLM_SITE=DIR runs it on the vLLM installed there (a second version, stage_vllm.sh's SITE)
  local name=$1 flags=$2 code=$PWD env=() site=/tmp/site
  if [[ $flags =~ ^[[:space:]]*@([^[:space:]]+)(.*)$ ]]; then
    code=$(cd "${BASH_REMATCH[1]}" && pwd) flags=${BASH_REMATCH[2]}
  fi
  while [[ $flags =~ ^[[:space:]]*([A-Za-z_][A-Za-z0-9_]*=[^[:space:]]*)(.*)$ ]]; do
    env+=("${BASH_REMATCH[1]}") flags=${BASH_REMATCH[2]}
    [[ ${env[-1]} == VLLM_SITE=* ]] && site=${env[-1]#VLLM_SITE=}
  done
  rm -f "$RES/${name}_steps.jsonl"
  # shellcheck disable=SC2086  # flag lists
  env "${env[@]}" PYTHONPATH=$site:$code python3 -P -m reward_server $COMMON $flags \
    --engine-option step_log="$RES/${name}_steps.jsonl" --port 18080 >"$RES/$name.server.log" 2>&1 &
  SERVER_PID=$!
  wait_server $URL $SERVER_PID 900 || { tail -20 "$RES/$name.server.log"; return 1; }
}

spy_up() {  # out file: py-spy samples the server and its engine core from now until spy_down
  # SPY_ARGS: py-spy's sampling flags (e.g. "--rate 100 --idle --native": waiting threads too, with
  # native frames, which shows a thread waiting for the interpreter lock; --native pauses the process)
  # shellcheck disable=SC2086  # flag list
  py-spy record --pid "$SERVER_PID" --subprocesses --threads ${SPY_ARGS:---rate 250 --nonblocking} --format raw \
    -o "$1" >"${1%.txt}_pyspy.log" 2>&1 &
  SPY_PID=$!
  sleep 2
}

spy_down() {
  if [ -n "$SPY_PID" ]; then kill -INT "$SPY_PID" 2>/dev/null || true; wait "$SPY_PID" 2>/dev/null || true; fi
  SPY_PID=""
}

server_down() {
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
}

serve_bench() {  # name, server flags, bench arguments...: one server, one bench, its phases
  local name=$1 flags=$2
  shift 2
  server_up "$name" "$flags" || return 0
  # SPY=1: sampled from now until the bench ends (warm-up batch included)
  if [ -n "${SPY:-}" ]; then spy_up "$RES/${name}_spy.txt"; fi
  python3 -m reward_tools.bench --url $URL --paths hook_raw --n "$N" "$@" --out "$RES/$name.json" \
    >"$RES/$name.txt" 2>"$RES/$name.log" || echo "$name: errors (see $name.log)"
  if [ -n "${FIDELITY_GEN:-}" ]; then  # the same episodes' answers (exact K greedy tokens), for a side-by-side
    python3 -m reward_tools.fidelity scores --url $URL --n "$N" --gen-tokens "$FIDELITY_GEN" \
      --out "$RES/${name}_answers.json" >/dev/null 2>>"$RES/$name.log" || echo "$name: no answers"
  fi
  spy_down
  server_down
  [ -f "$RES/$name.json" ] || { tail -20 "$RES/$name.log"; return 0; }
  python3 -m reward_tools.steps_report "$RES/$name.json" "$RES/${name}_steps.jsonl" --decode-tokens "${DECODE:-256}" \
    --out "$RES/${name}_phases.json" >"$RES/${name}_phases.md"
  echo "## $name ($flags)"; cat "$RES/${name}_phases.md"
}

trace_report() {  # name: once the worker wrote its trace under /tmp/trace_NAME, gpu_trace's report of it
  for _ in $(seq 60); do
    [ -n "$(find "/tmp/trace_$1" -name '*.json.gz' -size +1k 2>/dev/null)" ] && break
    sleep 2
  done
  sleep 3
  python3 -m reward_tools.gpu_trace "/tmp/trace_$1" --json "$RES/${1}_gpu.json" | tee "$RES/${1}_gpu.md"
}

pack() {  # everything under $RES as one file (the device returns at most 8)
  tar czf "$OUT/$1.tgz" -C "$RES" .
}

case "${1:?primo, primo_raw, k1_raw, k1_trace, k1_trace_server, k1, curves, curves_ab, curves_spy, ab or judges}" in
  primo)
    # shellcheck disable=SC2086  # PRIMO_STYLES is a list
    serve_bench primo "--backend PRIMO-R1 --max-tokens 4096 ${PRIMO_FLAGS:-} --warmup-batch $N" --styles ${PRIMO_STYLES:-gen1 gen256 gen1024} \
      --repeats "${REPEATS:-3}"
    ;;
  primo_raw)
    python3 -m reward_tools.bench_raw --engine vllm --backend PRIMO-R1 --model-path $CKPT --n "$N" \
      --styles gen1 gen256 --repeats "${REPEATS:-3}" --max-num-batched-tokens 65536 \
      --mm-encoder-attn-backend FLASH_ATTN --gpu-memory-utilization 0.85 --out "$RES/primo_raw.json" \
      2>"$RES/primo_raw.log" | tee "$RES/primo_raw.txt"
    ;;
  k1_raw)
    python3 -m reward_tools.bench_raw --engine vllm --model-path $CKPT --n "$N" --styles logprob \
      --repeats "${REPEATS:-5}" --max-model-len 8192 --max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN \
      --gpu-memory-utilization 0.85 --out "$RES/k1_raw.json" 2>"$RES/k1_raw.log" | tee "$RES/k1_raw.txt"
    ;;
  k1_trace)
    # the bare engine's K = 1 batch, then one more batch traced by vLLM's torch profiler: the GPU's own
    # busy time, the vision encoder's share and the idle gaps (reward_tools.gpu_trace). RAW_FLAGS: more
    # bench_raw flags (e.g. --compile-mm-encoder), TRACE_NAME: the result's name.
    name=${TRACE_NAME:-k1_trace}
    # shellcheck disable=SC2086  # flag list
    python3 -m reward_tools.bench_raw --engine vllm --model-path $CKPT --n "$N" --styles logprob \
      --repeats "${REPEATS:-3}" --max-model-len 8192 --max-num-batched-tokens 65536 --mm-encoder-attn-backend FLASH_ATTN \
      --gpu-memory-utilization 0.85 ${RAW_FLAGS:-} --profile-dir "/tmp/trace_$name" --out "$RES/$name.json" \
      2>"$RES/$name.log" | tee "$RES/$name.txt"
    trace_report "$name"
    ;;
  k1_trace_server)
    name=${TRACE_NAME:-k1_trace_server}
    serve_bench "$name" "${SERVER_FLAGS:-} --engine-option profile_dir=/tmp/trace_$name --warmup-batch $N" \
      --styles logprob --repeats "${REPEATS:-3}" --trace
    trace_report "$name"
    ;;
  k1)
    serve_bench k1 "--warmup-batch $N" --styles logprob --repeats "${REPEATS:-5}"
    ;;
  judges)
    # each judge's shipped preset (configs/server/JUDGE.yaml) started as the README says, one server per
    # judge: its hook path K = 1, then its curves, both styles, on that one warmed server
    COMMON="--log-level warning"  # the preset's settings alone
    for judge in ${JUDGES:-qwen2_5_vl_7b qwen3_vl_4b qwen3_vl_8b}; do
      ckpt=/tmp/ckpt_$judge
      [ "$judge" = qwen2_5_vl_7b ] && ckpt=$CKPT
      [ -f "$ckpt/config.json" ] || python3 -m reward_server.tiny_checkpoint "$ckpt" --preset "$judge" >/dev/null
      name="k1_$judge"
      server_up "$name" "--config configs/server/$judge.yaml --model-path $ckpt --gpu-ids 0" || continue
      python3 -m reward_tools.bench --url $URL --paths hook_raw --n "$N" --styles logprob p_true \
        --repeats "${REPEATS:-5}" --out "$RES/$name.json" >"$RES/$name.txt" 2>"$RES/$name.log" || echo "$name: errors (see $name.log)"
      curl -s $URL/stats >"$RES/${judge}_stats.json" || true
      for style in logprob p_true; do
        cname="curves_${judge}_$style"
        python3 -m reward_tools.bench_curves --url $URL --n "$N" --points 1 8 16 --style $style \
          --repeats "${CURVE_REPEATS:-3}" --no-plain --no-voc --out "$RES/$cname.json" >/dev/null 2>"$RES/$cname.log" \
          || echo "$cname: errors (see $cname.log)"
        [ -f "$RES/$cname.json" ] && { echo "## $cname"; python3 -m reward_tools.curves_table "$RES/$cname.json" | tee "$RES/${cname}_table.md"; }
      done
      server_down
      [ -f "$RES/$name.json" ] && python3 -m reward_tools.steps_report "$RES/$name.json" "$RES/${name}_steps.jsonl" \
        --out "$RES/${name}_phases.json" >"$RES/${name}_phases.md" && { echo "## $name"; cat "$RES/${name}_phases.md"; }
    done
    ;;
  curves)
    steps="$RES/curves_steps.jsonl"
    rm -f "$steps"
    # shellcheck disable=SC2086  # flag lists
    python3 -m reward_tools.bench_curves --launch "$COMMON ${CURVE_FLAGS:-} --warmup-batch $N --engine-option step_log=$steps" \
      --n "$N" --points ${CURVE_POINTS:-1 8 16} --style "${CURVE_STYLE:-logprob}" --repeats "${CURVE_REPEATS:-4}" --no-plain --no-voc \
      --out "$RES/curves.json" >/dev/null 2>"$RES/curves.log" || echo "curves: errors (see curves.log)"
    python3 -m reward_tools.curves_table "$RES/curves.json" | tee "$RES/curves_table.md"
    python3 -m reward_tools.steps_report "$RES/curves.json" "$steps" --out "$RES/curves_phases.json" \
      | tee "$RES/curves_phases.md"
    ;;
  curves_ab)
    IFS=';' read -r -a rows <<<"${AB_ROWS:?name=flags;name=flags...}"
    for round in $(seq "${AB_ROUNDS:-1}"); do
      for row in "${rows[@]}"; do
        name="cab_${row%%=*}_r$round"
        server_up "$name" "${row#*=} --warmup-batch $N" || continue
        python3 -m reward_tools.bench_curves --url $URL --n "$N" --points 1 8 16 --repeats "${CURVE_REPEATS:-3}" \
          --no-plain --no-voc --out "$RES/$name.json" >/dev/null 2>"$RES/$name.log" || echo "$name: errors (see $name.log)"
        server_down
        [ -f "$RES/$name.json" ] || { tail -20 "$RES/$name.log"; continue; }
        echo "## $name (${row#*=})"
        python3 -m reward_tools.curves_table "$RES/$name.json" | tee "$RES/${name}_table.md"
        python3 -m reward_tools.steps_report "$RES/$name.json" "$RES/${name}_steps.jsonl" \
          --out "$RES/${name}_phases.json" >"$RES/${name}_phases.md"
      done
    done
    ;;
  curves_spy)
    # curves K = 1 and 8 on a server of CURVE_FLAGS with py-spy on the server and its engine core
    # while the benchmark runs (why a setting changes curves: which thread got busier)
    name=${SPY_NAME:-curves_spy}
    server_up "$name" "${CURVE_FLAGS:-} --warmup-batch $N" || exit 1
    spy_up "$RES/$name.txt"
    # shellcheck disable=SC2086  # a list of K
    python3 -m reward_tools.bench_curves --url $URL --n "$N" --points ${SPY_POINTS:-1 8} --repeats "${CURVE_REPEATS:-3}" --no-plain \
      --no-voc --out "$RES/$name.json" >/dev/null 2>"$RES/$name.log" || echo "$name: errors (see $name.log)"
    spy_down
    server_down
    python3 -m reward_tools.curves_table "$RES/$name.json" | tee "$RES/${name}_table.md"
    python3 -m reward_tools.spy_report "$RES/$name.txt" --top 4 | tee "$RES/${name}_report.md"
    ;;
  curve_feed)
    IFS=';' read -r -a rows <<<"${FEED_ROWS:-feed=--compile-mm-encoder}"
    for row in "${rows[@]}"; do
      name="feed_${row%%=*}"
      # shellcheck disable=SC2086  # flag lists
      python3 -m reward_tools.benchmarks.curve_feed --points "${FEED_POINTS:-1,16}" --episodes "$N" --repeats "${FEED_REPEATS:-3}" \
        --out "$RES/$name.json" -- $COMMON ${row#*=} >/dev/null 2>"$RES/$name.log" || { echo "$name: failed"; tail -20 "$RES/$name.log"; }
      [ -f "$RES/$name.json" ] && python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['results'], indent=1))" "$RES/$name.json"
    done
    ;;
  input_cost)
    # one input thread's processing per 16-point curve on this host with nothing else running
    # (reward_tools/benchmarks/input_processing.py --ab, as on the CPU machine): a request whose items are all
    # cached with and without its HF processor call (vllm_cache_hits), and with the server's torch
    # threads at 2 and 4 (the engine sets 1 on GPUs), the rows in turn on the same episodes; every
    # engine input must come out the same in every row. INPUT_ROWS, INPUT_ROUNDS to choose.
    flags="--dtype bfloat16 --max-model-len 8192 --enforce-eager --gpu-memory-utilization 0.5"
    python3 -m reward_tools.benchmarks.input_processing --model-path $CKPT --episodes 16 --points 16 --raw-pixels \
      --ab "${INPUT_ROWS:-skip,call,skip_t2,skip_t4}" --repeats "${INPUT_ROUNDS:-4}" --engine-flags "$flags" \
      --out "$RES/input_ab.json" >"$RES/input_ab.log" 2>&1 || tail -20 "$RES/input_ab.log"
    [ -f "$RES/input_ab.json" ] && cat "$RES/input_ab.json"
    rm -f "$RES/input_ab.log"
    ;;
  ab)
    IFS=';' read -r -a rows <<<"${AB_ROWS:?name=flags;name=flags...}"
    names=()
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for row in "${rows[@]}"; do
        # shellcheck disable=SC2086  # STYLES is a list
        serve_bench "ab_${row%%=*}_r$round" "${row#*=} --warmup-batch $N" --styles ${STYLES:-logprob} \
          --repeats "${REPEATS:-3}"
        names+=("ab_${row%%=*}_r$round")
      done
    done
    if [ -n "${FIDELITY_GEN:-}" ] && [ ${#names[@]} -ge 2 ]; then  # every row's answers against the first row's
      for name in "${names[@]:1}"; do
        python3 -m reward_tools.fidelity compare "$RES/${names[0]}_answers.json" "$RES/${name}_answers.json" \
          --out "$RES/${name}_vs_${names[0]}.json" | grep -E "same_outputs|outputs_compared|spearman" || true
      done
    fi
    ;;
  *) echo "unknown case $1" >&2; exit 2 ;;
esac
pack "$1"
