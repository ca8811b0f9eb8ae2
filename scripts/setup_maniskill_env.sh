#!/usr/bin/env bash
# ManiSkill 3 (SAPIEN) in the simulator environment of scripts/setup_libero_env.sh, rendering on
# the CPU through Mesa's software Vulkan driver (lavapipe): for the tests and tiny runs of
# RLinf's patched ManiSkill env on machines without a GPU.
#
#   bash scripts/setup_maniskill_env.sh [VENV_DIR]     default: ~/.cache/reward_server/libero-venv
#
# Debian 12's own lavapipe (Mesa 22) is too old for SAPIEN's renderer; Mesa 25 from Debian's
# backports is not. Its Vulkan driver packages are unpacked into VENV_DIR/vulkan (nothing is
# installed system-wide, no apt source is added to the system): VENV_DIR/vulkan/env.sh exports
# VK_ICD_FILENAMES and LD_LIBRARY_PATH for processes that step ManiSkill on the CPU. A machine
# with a GPU needs none of it (its own Vulkan driver renders). Safe to run again.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${1:-${LIBERO_VENV:-$HOME/.cache/reward_server/libero-venv}}
PY="$VENV/bin/python"
VK="$VENV/vulkan"
log() { echo "[setup_maniskill_env] $*" >&2; }
die() { log "$*"; exit 1; }
[ -x "$PY" ] || die "no simulator environment at $VENV: bash scripts/setup_libero_env.sh first"

constraints=()
[ "${LIBERO_UNLOCKED:-0}" = 1 ] || constraints=(-c "$ROOT/requirements/libero.lock")
if ! "$PY" -c "import mani_skill, sapien" 2>/dev/null; then
  log "installing ManiSkill 3"
  "$PY" -m pip install -q "${constraints[@]}" mani-skill==3.0.1
fi

# --- Mesa's lavapipe, unpacked into $VK --------------------------------------------------------
DRIVERS=(mesa-vulkan-drivers libvulkan1 libdrm2 libdrm-amdgpu1 libdrm-common)
# what the driver links against that a machine without a desktop may lack (Debian 12 versions)
SYSTEM_LIBS=(libllvm15 libwayland-client0 libx11-xcb1 libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-shm0
  libxcb-sync1 libxcb-xfixes0 libxshmfence1 libelf1 libexpat1 libzstd1)
lvp() { echo "$VK/lib/libvulkan_lvp.so"; }
missing_libs() { LD_LIBRARY_PATH="$VK/lib" ldd "$(lvp)" | awk '/not found/ {print $1}'; }

if [ ! -f "$VK/icd.json" ]; then
  system=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-} ${PRETTY_NAME:-}") || true
  [ "${system%% *}" = bookworm ] \
    || die "this script knows lavapipe from Debian 12's backports; on ${system#* } install Mesa >= 25's Vulkan drivers and point VK_ICD_FILENAMES at its lvp_icd json"
  log "fetching Mesa 25's Vulkan drivers (lavapipe) into $VK"
  # a private apt state: the backports source is read here only, never added to the system
  apt_dir=$(mktemp -d)
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs" "$apt_dir/root"
  cat >"$apt_dir/sources.list" <<'SOURCES'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-backports main
SOURCES
  cat >"$apt_dir/apt.conf" <<CONF
Dir::Etc::SourceList "$apt_dir/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::State::Lists "$apt_dir/lists";
Dir::Cache "$apt_dir/cache";
Debug::NoLocking "1";
CONF
  [ "$(id -u)" != 0 ] || echo 'APT::Sandbox::User "root";' >>"$apt_dir/apt.conf"  # a private tmp dir
  export APT_CONFIG="$apt_dir/apt.conf"
  apt-get update -qq >/dev/null
  (cd "$apt_dir/debs" && apt-get download -qq -t bookworm-backports "${DRIVERS[@]}" >/dev/null)
  for deb in "$apt_dir"/debs/*.deb; do dpkg -x "$deb" "$apt_dir/root"; done
  unset APT_CONFIG
  rm -rf "$VK"
  mkdir -p "$VK/lib"
  # lavapipe, the Vulkan loader and the libdrm it was built against (not the GPU drivers)
  cp -a "$apt_dir"/root/usr/lib/x86_64-linux-gnu/{libvulkan_lvp.so,libvulkan.so*,libdrm*.so*} "$VK/lib/"
  # the ICD manifest names its driver by file name; point it at the unpacked one
  sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$(lvp)\"#" \
    "$apt_dir/root/usr/share/vulkan/icd.d/lvp_icd.json" >"$VK/icd.json.tmp"
  rm -rf "$apt_dir"
  trap - EXIT
  missing=$(missing_libs)
  if [ -n "$missing" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      log "installing what lavapipe links against: $(echo "$missing" | tr '\n' ' ')"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${SYSTEM_LIBS[@]}" >/dev/null
      missing=$(missing_libs)
    fi
    [ -z "$missing" ] || die "lavapipe lacks libraries: $(echo "$missing" | tr '\n' ' ')(apt-get install ${SYSTEM_LIBS[*]})"
  fi
  mv "$VK/icd.json.tmp" "$VK/icd.json"  # last: its presence means a complete install
fi

cat >"$VK/env.sh" <<ENV
# ManiSkill / SAPIEN rendering on the CPU (Mesa lavapipe), written by scripts/setup_maniskill_env.sh
export VK_ICD_FILENAMES="$VK/icd.json"
export LD_LIBRARY_PATH="$VK/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ENV

# shellcheck disable=SC1091
. "$VK/env.sh"
"$PY" - <<'CHECK' >&2
import gymnasium as gym
import mani_skill.envs  # noqa: F401  registers the tasks

env = gym.make("PickCube-v1", num_envs=1, obs_mode="rgb", sim_backend="physx_cpu", render_backend="cpu",
               sensor_configs={"shader_pack": "minimal", "width": 32, "height": 32})
obs, _ = env.reset(seed=0)
frame = obs["sensor_data"]["base_camera"]["rgb"]
assert frame.shape == (1, 32, 32, 3) and int(frame.max()) > 0, "ManiSkill rendered a blank frame"
env.close()
print("[setup_maniskill_env] ManiSkill renders on lavapipe")
CHECK
cat <<ENV
VK_ICD_FILENAMES=$VK/icd.json
LD_LIBRARY_PATH=$VK/lib
ENV
log "ready: . $VK/env.sh"
