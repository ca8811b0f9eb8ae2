#!/usr/bin/env bash
# Prepare a real vLLM for the lent GPU machines (device tool): no package registry there, and one call
# carries at most 64 MiB, this checkout's tree included. Run here, from the repo root:
#
#   bash scripts/gpu/prepare_vllm_carry.sh [VERSION] [OUT]     VERSION 0.26.0 (default) or 0.24.0, OUT .vx
#
# Makes OUT/c1 .. OUT/cN, each small enough to travel with the tree as it is now (64 MiB less the
# tree's tracked and untracked files, less 1 MiB), prints N and the device calls, and keeps OUT out
# of git (.gitignore names .vx/). Then, back to back (a machine stays warm ~30 s between calls):
#   run(carry=[".vx/c1"]): bash scripts/gpu/stage_vllm.sh piece
#   ...
#   run(carry=[".vx/cN"]): bash scripts/gpu/stage_vllm.sh piece install && <the measurement>
# stage_vllm.sh install checks that all N pieces arrived, installs into /tmp/site and builds the
# random-weight 7B-shaped checkpoint; later calls: export PYTHONPATH=/tmp/site:$PWD
# VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 (scripts/gpu/profile_gpu.sh sets them).
#
# Which vLLM: the machines have torch 2.11.0+cu130 and transformers 5.17, and torch with its CUDA
# libraries (GBs) cannot travel. vLLM's wheels pin torch exactly: 0.24.0-0.26.0 pin 2.11.0, 0.27.0-0.32.0
# pin 2.13.0, 0.33.0 pins 2.14.0 (each wheel's metadata). So 0.26.0 is the newest that runs there.
# vLLM 0.26 runs dense models such as Qwen2.5-VL on its Model Runner V2 by default
# (VLLM_USE_V2_MODEL_RUNNER=0: the V1 runner every patch here was measured on).
#
# Stripped from the wheel, as the recipe for 0.24 did: FlashAttention-2 kernels (FlashAttention-3, used on
# Hopper, stays), MoE kernels, the Rust frontend binary, JIT headers (deep_gemm, fmha_sm100). Dense
# models only; no flashinfer (VLLM_USE_FLASHINFER_SAMPLER=0). The runtime packages vLLM's offline
# engine needs that the machines' image lacks travel as wheels (DEPS, the 0.24 recipe's list, whose
# pins 0.26's metadata accepts), with this server's own (av, httptools, orjson, loguru).
set -euo pipefail
VERSION=${1:-0.26.0}
OUT=${2:-.vx}
MIB=$((1024 * 1024))
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
log() { echo "[prepare_vllm_carry] $*" >&2; }

# what travels with every call besides a carry: tracked files and untracked ones git does not ignore
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
room=$((64 * MIB - tree - MIB))
[ "$room" -gt $((8 * MIB)) ] || { log "the tree is $((tree / MIB)) MiB: no room left in a 64 MiB call"; exit 1; }
log "tree $((tree / MIB)) MiB: pieces of at most $((room / MIB)) MiB"

PIPDL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
       --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"${PIPDL[@]}" -d "$W/whl" "vllm==$VERSION"
mkdir -p "$W/x" "$W/parts" && (cd "$W/x" && unzip -q "$W"/whl/vllm-"$VERSION"-*.whl)
FA3=vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so
xz -T0 -6 -c "$W/x/$FA3" > "$W/fa3.xz"
rm -f "$W/x/$FA3" "$W/x/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$W/x/vllm/_moe_C_stable_libtorch.abi3.so" "$W/x/vllm/vllm-rs"
rm -rf "$W/x/vllm/third_party/deep_gemm" "$W/x/vllm/third_party/fmha_sm100"
(cd "$W/x" && tar cf - vllm "vllm-$VERSION.dist-info") | xz -T0 -6 > "$W/vllm.txz"
# chunks a piece can hold (a piece also holds a few small files)
chunk=$((room - 256 * 1024))
(cd "$W" && split -b "$chunk" -d -a 2 vllm.txz parts/vllm.txz.part_ && split -b "$chunk" -d -a 2 fa3.xz parts/fa3.xz.part_)

DEPS=(msgspec pyzmq blake3 cbor2 pybase64 setproctitle compressed-tensors==0.17.0 depyf==0.20.0 astor dill
      diskcache==5.6.3 lark==1.2.2 partial-json-parser pydantic pydantic-core annotated-types typing-inspection
      mistral_common==1.11.6 pydantic-extra-types pycountry jsonschema jsonschema-specifications referencing rpds-py
      python-json-logger watchfiles ijson openai-harmony gguf "llguidance<1.8" outlines_core==0.2.14 xgrammar==0.2.8
      apache-tvm-ffi==0.1.15.post2 lm-format-enforcer==0.11.3 interegular prometheus-fastapi-instrumentator
      "fastapi<0.137" starlette openai==2.14.0 distro jiter sniffio cachetools opentelemetry-api opentelemetry-sdk
      opentelemetry-semantic-conventions opentelemetry-semantic-conventions-ai uvicorn python-multipart
      av httptools orjson loguru httpx2 httpcore2 truststore idna anyio
      model-hosting-container-standards jmespath supervisor)
# at the GPU lock's versions where it names them, for the vLLM it locks (a locked install's set:
# the openai client vLLM's own `vllm serve` imports, 3.x on httpx2, did not travel before)
LOCKED=$(sed -n 's/^vllm==//p' requirements/gpu.lock)
if [ "$VERSION" = "$LOCKED" ]; then
  mapfile -t DEPS < <(python3 scripts/lock_gpu.py pins requirements/gpu.lock 3.12 "${DEPS[@]}")
fi
"${PIPDL[@]}" -d "$W/parts" "${DEPS[@]}"
# `vllm serve` (the chat route's comparison) imports more than the engine that ran there: whatever of
# that no wheel here provides would stop it on the device, after the staging calls were spent
if ! python3 scripts/gpu/carry_imports.py "$W/x" "$W/parts"; then
  [ "$VERSION" != "$LOCKED" ] || { log "add those to DEPS"; exit 1; }
  log "vllm serve $VERSION would not start from this carry (the server's engine would)"
fi

# first fit, largest first: as few pieces as the room allows
rm -rf "$OUT"/c[0-9]*; mkdir -p "$OUT"
declare -a used=()
n=0
while read -r size file; do
  placed=0
  for i in $(seq 1 "$n"); do
    if [ $((used[i] + size)) -le "$chunk" ]; then used[i]=$((used[i] + size)); mv "$file" "$OUT/c$i/"; placed=1; break; fi
  done
  if [ "$placed" = 0 ]; then n=$((n + 1)); used[n]=$size; mkdir -p "$OUT/c$n"; mv "$file" "$OUT/c$n/"; fi
done < <(find "$W/parts" -type f -printf '%s %p\n' | sort -rn)
for i in $(seq 1 "$n"); do
  echo "$VERSION $i $n" > "$OUT/c$i/PIECE_$i"  # stage_vllm.sh install: which vLLM, which piece of how many
done
if ! git check-ignore -q "$OUT/c1/PIECE_1"; then  # .gitignore names .vx/; another OUT is excluded here
  exclude=$(git rev-parse --git-path info/exclude)  # (a worktree's .git is a file)
  mkdir -p "$(dirname "$exclude")"; echo "/$OUT/" >> "$exclude"
fi
du -sh "$OUT"/c[0-9]* >&2
log "vLLM $VERSION in $n pieces; device calls, back to back:"
# another OUT than .vx is a second vLLM beside the first: staged and installed apart (stage_vllm.sh)
apart=""
[ "$OUT" = .vx ] || apart="CARRY=$OUT STAGE=/tmp/stage_$VERSION SITE=/tmp/site_$VERSION "
for i in $(seq 1 "$n"); do
  if [ "$i" -lt "$n" ]; then echo "  run(carry=[\"$OUT/c$i\"]): ${apart}bash scripts/gpu/stage_vllm.sh piece"
  else echo "  run(carry=[\"$OUT/c$i\"]): ${apart}bash scripts/gpu/stage_vllm.sh piece install && <the measurement>"; fi
done
