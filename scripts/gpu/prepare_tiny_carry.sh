#!/usr/bin/env bash
# Stage what scripts/run_tiny_experiments.sh needs on a lent GPU machine (device tool). That
# machine has Python 3.12, torch, torchvision, transformers 5 and tensorboard, but nothing of
# RLinf's runner, LIBERO, or this server's HTTP stack, and no package index; one call carries
# at most 64 MiB. Two folders, one carry each:
#   OUT/t1  wheels for Python 3.12 at the versions of requirements/libero.lock and cpu.lock: RLinf's runner
#           (hydra, gymnasium), LIBERO (mujoco, bddl, gym, rlinf-libero), the server's HTTP stack,
#           matplotlib for the comparison PNG
#   OUT/t2  ray (its Java jars, dashboard UI and the libraries the runner never imports left out),
#           robosuite with only the assets LIBERO-10 task 8 opens, rlinf 0.3.0 with
#           examples/embodiment, and the EGL libraries MuJoCo renders with
#
#   bash scripts/gpu/prepare_tiny_carry.sh .vx/tiny
#
# Needs pip reaching a package index, apt-get (for the EGL .debs) and the LIBERO environment of
# scripts/setup_libero_env.sh (its rlinf package and LIBERO assets). ASSET_LIST names the asset
# files task 8 opens (default: the traced list in ../shared/rlinf_tiny). On the device:
# scripts/gpu/tiny_experiments_gpu.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$(mkdir -p "${1:?usage: $0 OUT_DIR}" && cd "$1" && pwd)
VENV=${LIBERO_VENV:-$HOME/.cache/reward_server/libero-venv}
EXAMPLES=${RLINF_EXAMPLES:-$ROOT/../shared/rlinf_v0.3/examples}
ASSET_LIST=${ASSET_LIST:-$ROOT/../shared/rlinf_tiny/assets_task8.txt}
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
LOCKS=("$ROOT/requirements/libero.lock" "$ROOT/requirements/cpu.lock")
for need in "$SITE/rlinf" "$SITE/libero/libero/assets" "$EXAMPLES/embodiment" "$ASSET_LIST"; do
  [ -e "$need" ] || { echo "prepare_tiny_carry: missing $need" >&2; exit 1; }
done
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
rm -rf "$OUT/t1" "$OUT/t2"; mkdir -p "$OUT/t1/whl" "$OUT/t2/gl"

pinned() {  # names -> name==version from the locks (the versions CI runs: LIBERO's, then the server's)
  local name line
  for name in "$@"; do
    line=$(cat "${LOCKS[@]}" | grep -i -m1 -E "^${name//[-_]/[-_]}==" || true)
    [ -n "$line" ] || { echo "prepare_tiny_carry: $name is in no lock file" >&2; exit 1; }
    echo "$line"
  done
}
py312=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
wheels=(hydra-core omegaconf antlr4-python3-runtime gymnasium farama-notifications gym gym-notices
        mujoco bddl future easydict termcolor pyopengl rlinf-libero jsonschema jsonschema-specifications
        referencing rpds-py pydantic pydantic-core annotated-types typing-inspection orjson pybase64
        fastapi starlette annotated-doc uvicorn httptools uvloop prometheus-client
        matplotlib contourpy cycler fonttools kiwisolver pyparsing python-dateutil)
pin_list=$(pinned "${wheels[@]}")  # fails here if a package is in no lock
mapfile -t pins <<<"$pin_list"
# a few of these ship only as source: build them here (all pure Python)
for pin in "${pins[@]}"; do
  python3 -m pip download -q --no-deps "${py312[@]}" -d "$OUT/t1/whl" "$pin" 2>/dev/null \
    || python3 -m pip wheel -q --no-deps -w "$OUT/t1/whl" "$pin"
done

python3 -m pip download -q --no-deps "${py312[@]}" -d "$work" "$(pinned ray)" "$(pinned robosuite)"
mkdir "$work/ray" "$work/rs" "$work/rlinf"
(cd "$work/ray" && unzip -q "$work"/ray-*.whl \
  && rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/tune ray/train ray/data ray/serve ray/air \
  && tar cf - ray ray-*.dist-info) | xz -T0 -6 >"$OUT/t2/ray.txz"
(cd "$work/rs" && unzip -q "$work"/robosuite-*.whl && rm -rf robosuite/models/assets)
(cd "$SITE" && tar cf - -T "$ASSET_LIST") | (cd "$work/rs" && tar xf -)
(cd "$work/rs" && tar cf - robosuite robosuite-*.dist-info libero) | xz -T0 -6 >"$OUT/t2/robosuite_assets.txz"
cp -r "$SITE/rlinf" "$work/rlinf/" && mkdir -p "$work/rlinf/examples" && cp -r "$EXAMPLES/embodiment" "$work/rlinf/examples/"
find "$work/rlinf" -name __pycache__ -prune -exec rm -rf {} +
(cd "$work/rlinf" && tar cf - rlinf examples) | xz -T0 -6 >"$OUT/t2/rlinf_src.txz"

apt_state="$work/apt"; mkdir -p "$apt_state/partial"
apt_opts=(-o APT::Architecture=amd64 -o Dir::State::Lists="$apt_state")
apt-get "${apt_opts[@]}" update -qq >/dev/null
(cd "$OUT/t2/gl" && apt-get "${apt_opts[@]}" download -qq \
  libegl1 libgl1 libglx0 libgles2 libglvnd0 libopengl0 libvulkan1 >/dev/null)
du -sh "$OUT/t1" "$OUT/t2"
