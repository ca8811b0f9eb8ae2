#!/usr/bin/env bash
# Tiny runs A, B, C and D through RLinf's own training entry point, then the comparison PNG: the
# whole loop (Hydra config, Ray workers, LIBERO-10 simulator, reward server, TensorBoard) in
# about 7 minutes on 2 CPU cores.
#
#   bash scripts/run_tiny_experiments.sh [--env libero|starvla|maniskill] [--rlinf DIR|main] [--out DIR]
#        [--runs A,B,C,D,B3] [--steps N|N,RUN=N,...] [--judge-model DIR] [--qwen3-judge-model DIR]
#
# The run configs are the full-size ones (configs/rlinf/); TINY below is the only place that makes
# them small: RLinf's mlp_policy (random init; reads LIBERO's 8 state numbers) instead of
# OpenVLA-OFT, 2 envs x 16 steps on LIBERO-10 task 8, one group of 2, 2 training steps (--steps: 1
# for every run, or 1,B=2 for 1 but B's 2; each step is one more rollout and training step). The judge
# of both B and C is a random-weight tiny Qwen2.5-VL with the Qwen profile on the transformers
# engine, scoring in logprob mode: random weights write no number, and PRIMO-R1's profile needs a
# written <answer> (it refuses logprob). --judge-model serves another Qwen2.5-VL checkpoint. Run B3
# (run B's config with a Qwen3-VL judge, --runs ...,B3) is judged by a random-weight tiny Qwen3-VL
# (tiny_checkpoint --preset qwen3_vl) on the qwen3_vl backend, the same engine and mode;
# --qwen3-judge-model serves another.
# Run D (PPO on the judge's progress curves, dense rewards) gets TINY_D besides: a value head on
# the mlp_policy, one env per group, one PPO epoch.
# scripts/run_experiments.sh starts the server for B, C and D beside RLinf, watches it until
# healthy and stops it, as at full size.
# --env maniskill runs the ManiSkill configs (RLinf's PPO with its MLP policy on PickCube-v1) made
# small by TINY_MANISKILL: one env (ManiSkill's CPU physics runs one per env object), 16 steps,
# 56x56 frames, 2 training steps; without CUDA on CPU physics, rendering on Mesa's lavapipe
# (scripts/setup_maniskill_env.sh).
# --env starvla (RLinf main only) runs the StarVLA configs on LIBERO-10
# (libero_10_grpo_starvla_run{A,B_qwen,C_primo}: main's LiberoEnv and env worker, GRPO, 8-action
# chunks, chunk-level rewards) made small by TINY_STARVLA: StarVLA's 3B QwenOFT cannot run here, so
# RLinf's mlp_policy stands in for it with StarVLA's chunking (8 actions a chunk: 16 steps are 2
# chunk steps); only LIBERO-10's assets are on the CPU machines, so LIBERO-10 task 8, not
# libero_spatial.
#
# --rlinf: an RLinf checkout, v0.3 or main (apply_rlinf_patches.sh tells them apart); `main`: the
# RLinf main that scripts/setup_rlinf_main.sh unpacks; default: RLinf v0.3, the rlinf package of the
# LIBERO environment plus the examples/ folder at $RLINF_EXAMPLES. It is copied to OUT/rlinf and
# patched there, never in place. Without CUDA the copy also gets the version's test-only CPU shim
# (tests/rlinf_cpu_shim.patch, tests/rlinf_cpu_shim_main.patch: RLinf has no CPU path; test
# infrastructure that apply_rlinf_patches.sh never applies) and the bucket weight syncer; with
# CUDA the same command runs RLinf unmodified but for the project's patch.
# Writes OUT/compare.png and OUT/compare.csv, and prints a per-step summary (OUT/summary.txt).
# Environment: LIBERO_VENV (scripts/setup_libero_env.sh), PYTHON (the reward server's, default python3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
VENV=${LIBERO_VENV:-$HOME/.cache/reward_server/libero-venv}
LIBERO_PY="$VENV/bin/python"
die() { echo "run_tiny_experiments: $*" >&2; exit 1; }
log() { echo "[run_tiny_experiments] $*" >&2; }

# The one place that makes the full-size run configs tiny (Hydra overrides).
TINY=(
  actor.model.model_type=mlp_policy +actor.model.obs_dim=8 actor.model.action_dim=7
  actor.model.num_action_chunks=1 actor.model.precision=fp32 actor.model.add_value_head=False
  actor.model.model_path=null rollout.model.model_path=null
  '~cluster.component_placement' +cluster.component_placement.actor=0
  +cluster.component_placement.env=0 +cluster.component_placement.rollout=0
  algorithm.group_size=2 env.train.total_num_envs=2 env.train.rollout_epoch=1
  env.train.max_episode_steps=16 env.train.max_steps_per_rollout_epoch=16 +env.train.specific_reset_id=400
  env.train.video_cfg.save_video=False env.train.reward_model.score_mode=logprob
  C:env.train.reward_model.backend=qwen2_5_vl_vllm
  env.train.reward_model.wait_ready_s=120
  actor.micro_batch_size=16 actor.global_batch_size=32 actor.enable_offload=False rollout.enable_offload=False
  actor.fsdp_config.gradient_checkpointing=False actor.fsdp_config.sharding_strategy=no_shard
  runner.save_interval=-1
  # the run configs judge asynchronously; B judges synchronously, so the tiny runs cover both modes
  B:env.train.reward_model.async=False
)
# Run D's own (run_experiments.sh gives a RUN: override to that run alone): PPO needs the critic.
TINY_D=(D:actor.model.add_value_head=True D:algorithm.group_size=1 D:algorithm.update_epoch=1)
# The same for RLinf main's StarVLA run configs on LIBERO-10 (StarVLA's shape, RLinf's mlp_policy):
# the policy keeps StarVLA's 8-action chunks, GRPO groups of 2, 2 envs x 16 steps (2 chunk steps)
# on task 8, 2 training steps of the 4 chunk-level samples a rollout gives.
TINY_STARVLA=(
  actor.model.model_type=mlp_policy +actor.model.obs_dim=8 actor.model.action_dim=7
  actor.model.precision=fp32 actor.model.add_value_head=False
  actor.model.model_path=null rollout.model.model_path=null
  '~cluster.component_placement' +cluster.component_placement.actor=0
  +cluster.component_placement.env=0 +cluster.component_placement.rollout=0
  algorithm.group_size=2 env.train.total_num_envs=2 env.train.rollout_epoch=1
  env.train.max_episode_steps=16 env.train.max_steps_per_rollout_epoch=16 +env.train.specific_reset_id=400
  env.train.video_cfg.save_video=False runner.val_check_interval=-1
  env.train.reward_model.score_mode=logprob C:env.train.reward_model.backend=qwen2_5_vl_vllm
  env.train.reward_model.wait_ready_s=120
  actor.micro_batch_size=4 actor.global_batch_size=4 actor.enable_offload=False rollout.enable_offload=False
  actor.fsdp_config.gradient_checkpointing=False actor.fsdp_config.sharding_strategy=no_shard
  runner.save_interval=-1
  B:env.train.reward_model.async=False
)
# The same for the ManiSkill run configs (RLinf's maniskill_ppo_mlp.yaml with the judge).
TINY_MANISKILL=(
  env.train.total_num_envs=1 env.eval.total_num_envs=1
  env.train.max_episode_steps=16 env.train.max_steps_per_rollout_epoch=16
  env.eval.max_episode_steps=16 env.eval.max_steps_per_rollout_epoch=16
  env.train.init_params.sensor_configs.width=56 env.train.init_params.sensor_configs.height=56
  env.eval.init_params.sensor_configs.width=56 env.eval.init_params.sensor_configs.height=56
  env.eval.video_cfg.save_video=False env.train.reward_model.score_mode=logprob
  C:env.train.reward_model.backend=qwen2_5_vl_vllm env.train.reward_model.wait_ready_s=120
  algorithm.update_epoch=1 actor.micro_batch_size=16 actor.global_batch_size=16
  rollout.enable_torch_compile=False rollout.enable_cuda_graph=False
  runner.val_check_interval=-1 runner.save_interval=-1
)
# ManiSkill without CUDA: CPU physics, and SAPIEN's Vulkan device is the CPU (lavapipe).
MANISKILL_CPU=(
  env.train.init_params.sim_backend=cpu +env.train.init_params.render_backend=cpu
  env.eval.init_params.sim_backend=cpu +env.eval.init_params.render_backend=cpu
)
# RLinf's default patch syncer needs CUDA; the bucket syncer also runs on CPU.
CPU_ONLY=(weight_syncer.type=bucket +weight_syncer.bucket.bucket_size=536870912 +weight_syncer.bucket.load_instant=true)

env_name=libero; suite=(); rlinf_src=""; out="$ROOT/experiments/tiny-$(date +%Y%m%d-%H%M%S)"; runs=""; judge=""; judge3=""; port=""
steps=2
examples=${RLINF_EXAMPLES:-$ROOT/../shared/rlinf_v0.3/examples}
while [ $# -gt 0 ]; do
  case "$1" in
    --env) env_name=$2; shift 2 ;;
    --rlinf) rlinf_src=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --judge-model) judge=$2; shift 2 ;;
    --qwen3-judge-model) judge3=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) die "unknown option '$1' (usage: $0 [--env libero|starvla|maniskill] [--rlinf DIR|main] [--out DIR] [--runs A,B,C,D,B3] [--steps N|N,RUN=N,...] [--judge-model DIR] [--qwen3-judge-model DIR] [--port N])" ;;
  esac
done
case "$env_name" in
  libero) sim=libero; overrides=("${TINY[@]}" "${TINY_D[@]}"); runs=${runs:-A,B,C,D} ;;
  starvla) sim=libero; overrides=("${TINY_STARVLA[@]}"); runs=${runs:-A,B,C}; suite=(--suite libero_10) ;;
  maniskill) sim=mani_skill; overrides=("${TINY_MANISKILL[@]}"); runs=${runs:-A,B,C} ;;
  *) die "unknown env '$env_name' (libero, starvla or maniskill)" ;;
esac
# Training steps (runner.max_epochs) run by run: "N" for all, "N,RUN=N,..." for N but the runs named.
declare -A run_steps=()
default_steps=""
IFS=, read -r -a step_items <<<"$steps"
for item in "${step_items[@]}"; do
  if [[ $item =~ ^[1-9][0-9]*$ ]]; then default_steps=$item
  elif [[ $item =~ ^(A|B|B3|C|D)=([1-9][0-9]*)$ ]]; then run_steps[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
  else die "--steps '$steps': '$item' is neither a count (e.g. 1) nor RUN=COUNT (e.g. B=2; runs A, B, B3, C, D)"
  fi
done
IFS=, read -r -a run_list <<<"$runs"
for run in "${run_list[@]}"; do
  n=${run_steps[$run]:-$default_steps}
  [ -n "$n" ] || die "--steps '$steps' gives no count for run $run: name it ($run=N) or give one for every run (N,...)"
  overrides+=("$run:runner.max_epochs=$n")
done
if [ "$rlinf_src" = main ]; then
  rlinf_src=$(LIBERO_VENV="$VENV" bash "$ROOT/scripts/setup_rlinf_main.sh" | sed -n 's/^RLINF_MAIN_DIR=//p')
  [ -n "$rlinf_src" ] || die "scripts/setup_rlinf_main.sh gave no RLinf main checkout"
fi

[ -x "$LIBERO_PY" ] || die "no LIBERO environment at $VENV: bash scripts/setup_libero_env.sh"
# with --rlinf the checkout brings rlinf itself
imports=$sim,torchvision,transformers,tensorboard,hydra,ray
[ -n "$rlinf_src" ] || imports="rlinf,$imports"
"$LIBERO_PY" -c "import $imports" 2>/dev/null \
  || die "$VENV lacks what RLinf's runner imports ($imports): bash scripts/setup_libero_env.sh"
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS
# this checkout's reward_server and reward_client, in the server and in RLinf's Ray workers alike
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# A private copy of RLinf: the CPU shim and the runs' logs never touch the user's checkout.
tree="$out/rlinf"
rm -rf "$tree"
mkdir -p "$tree/examples"
if [ -n "$rlinf_src" ]; then
  [ -d "$rlinf_src/rlinf" ] && [ -d "$rlinf_src/examples/embodiment" ] || die "$rlinf_src is not an RLinf checkout"
  cp -r "$rlinf_src/rlinf" "$tree/"
  cp -r "$rlinf_src/examples/embodiment" "$tree/examples/"
else
  [ -d "$examples/embodiment" ] || die "no RLinf examples/ at $examples: pass --rlinf CHECKOUT or set RLINF_EXAMPLES"
  cp -r "$("$LIBERO_PY" -c 'import os, rlinf; print(os.path.dirname(rlinf.__file__))')" "$tree/"
  cp -r "$examples/embodiment" "$tree/examples/"
fi
find "$tree" -name __pycache__ -prune -exec rm -rf {} +
version=$(bash "$ROOT/scripts/apply_rlinf_patches.sh" "$tree" --which)
[ "$env_name" != starvla ] || [ "$version" = main ] || die "--env starvla needs RLinf main (--rlinf main); $rlinf_src is RLinf $version"
bash "$ROOT/scripts/apply_rlinf_patches.sh" "$tree" >&2
shim="$ROOT/tests/rlinf_cpu_shim.patch"
[ "$version" = v0.3 ] || shim="$ROOT/tests/rlinf_cpu_shim_$version.patch"

if "$LIBERO_PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  log "CUDA present: RLinf as released (plus the project's patch)"
else
  log "no CUDA: applying the test-only CPU shim to the copy"
  (cd "$tree" && GIT_CEILING_DIRECTORIES="$(dirname "$tree")" git apply "$shim")
  overrides+=("${CPU_ONLY[@]}")
  if [ "$env_name" = maniskill ]; then
    overrides+=("${MANISKILL_CPU[@]}")
    [ -f "$VENV/vulkan/env.sh" ] || die "no lavapipe in $VENV for ManiSkill on the CPU: bash scripts/setup_maniskill_env.sh"
    # shellcheck disable=SC1091  # written by setup_maniskill_env.sh: VK_ICD_FILENAMES, LD_LIBRARY_PATH
    . "$VENV/vulkan/env.sh"
  fi
fi

if [ -z "$judge" ]; then
  judge="$out/judge"
  "$PY" -m reward_server.tiny_checkpoint "$judge" >&2
fi
qwen3=()
if [[ ,$runs, == *,B3,* ]]; then
  if [ -z "$judge3" ]; then
    judge3="$out/judge_qwen3"
    "$PY" -m reward_server.tiny_checkpoint "$judge3" --preset qwen3_vl >&2
  fi
  qwen3=(--qwen3-model "$judge3")
fi
[ -n "$port" ] || port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")

# A Ray of the runs' own: RLinf's driver calls ray.init(address="auto"), which joins any Ray
# already running on this host (Ray finds their GCS processes, whatever their directory);
# RAY_ADDRESS=local makes it start one, in its own directory (short: Ray's socket paths must fit
# in 107 characters). Two tiny runs at once, or one beside another Ray, stay apart.
ray_tmp=$(mktemp -d "${TMPDIR:-/tmp}/tiny-ray.XXXXXX")
trap 'rm -rf "$ray_tmp"' EXIT

log "runs $runs -> $out"
status=0
RLINF_PYTHON="$LIBERO_PY" RAY_ADDRESS=local RAY_TMPDIR="$ray_tmp" RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-600} HEALTH_TIMEOUT_S=300 \
  LIBERO_CONFIG_PATH="$VENV/libero_config" TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 \
  REWARD_SERVER_FLAGS="--engine hf --config $ROOT/configs/server/cpu_tiny.yaml" PRIMO_BACKEND=qwen2_5_vl_vllm \
  bash "$ROOT/scripts/run_experiments.sh" "$tree" --env "$env_name" "${suite[@]}" --runs "$runs" --qwen-model "$judge" --primo-model "$judge" "${qwen3[@]}" \
  --reward-gpus 0 --port "$port" --out "$out" -- "${overrides[@]}" || status=$?

compare=()
for run in "${run_list[@]}"; do
  log_path=$(cat "$out/run$run/log_path" 2>/dev/null || true)
  if [ -d "$log_path/tensorboard" ]; then compare+=("--run" "$run=$log_path"); fi
done
[ ${#compare[@]} -gt 0 ] || die "no run wrote TensorBoard logs; see $out/run*/console.log"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m reward_tools.compare_runs "${compare[@]}" --out "$out/compare" \
  --metric env/success_once --metric env/return --metric env/vlm_score --metric train/actor/grad_norm \
  --title "Tiny ${runs//,/\/} ($env_name) through RLinf $version's train_embodied_agent.py (mlp_policy, random-weight judge)"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m reward_tools.tiny_summary "${compare[@]}" | tee "$out/summary.txt"
log "done in $((SECONDS - start)) s: $out/compare.png"
exit $status
