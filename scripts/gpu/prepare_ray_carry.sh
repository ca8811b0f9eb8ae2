#!/usr/bin/env bash
# Stage Ray Serve for a lent GPU machine (device tool), next to vLLM staged with
# ../shared/gpu/prepare_vllm_carry.sh. That machine has Python 3.12 but no Ray and no package
# index, and one call carries at most 64 MiB, less than Ray's wheel: the wheel (at the version of
# requirements/cpu.lock, for Python 3.12) is unpacked without what Serve never loads (Java jars,
# the dashboard's web UI, RLlib, Tune, Train, Data, LLM), packed with xz, split into parts of one
# carry each, and Serve's small dependency wheels (locked versions) go beside them:
#
#   bash scripts/gpu/prepare_ray_carry.sh [OUT=.vx/ray]      # here: OUT/r1, OUT/r2, ... (git-ignored)
#
# then one device call per part, back to back on one warm machine (after vLLM's three), the
# last one installing:
#
#   run(carry=[".vx/ray/r1"]): bash .vx/ray/r1/stage.sh
#   run(carry=[".vx/ray/r2"]): bash .vx/ray/r2/stage.sh && bash .vx/ray/r2/device_install.sh && <command>
#
# device_install.sh joins the parts into /tmp/site (where the vLLM recipe installs) and installs
# each dependency wheel only where the machine (or /tmp/site) lacks it or has an older version,
# then checks that `ray.serve` imports. Needs pip reaching a package index, here.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-.vx/ray}
LOCK="$ROOT/requirements/cpu.lock"
PART_BYTES=${PART_BYTES:-52000000}  # a part and its share of the wheels stay under one 62 MiB carry
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

pinned() {  # names -> name==version from cpu.lock (the versions the CPU tests run Ray Serve with)
  local name line
  for name in "$@"; do
    line=$(grep -i -m1 -E "^${name//[-_]/[-_]}==" "$LOCK" || true)
    [ -n "$line" ] || { echo "prepare_ray_carry: $name is not in $LOCK" >&2; exit 1; }
    echo "$line"
  done
}
py312=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

# Ray Serve's own requirements and theirs, less what the machine has (torch's and transformers'
# dependencies: numpy, requests, pyyaml, filelock, packaging, jinja2, protobuf) and what the vLLM
# carry stages (pydantic, fastapi, starlette, uvicorn, jsonschema, watchfiles, opentelemetry-api/sdk)
deps=(click msgpack aiohttp aiohappyeyeballs aiosignal frozenlist multidict yarl propcache attrs aiohttp-cors
      colorful grpcio opencensus opencensus-context google-api-core googleapis-common-protos proto-plus google-auth
      pyasn1 pyasn1_modules cachetools py-spy smart_open wrapt virtualenv distlib platformdirs mmh3
      opentelemetry-proto opentelemetry-exporter-prometheus prometheus_client uvloop httptools websockets
      python-dotenv six)
pin_list=$(pinned "${deps[@]}")  # fails here if a package is in no lock
mapfile -t pins <<<"$pin_list"
python3 -m pip download -q --no-deps "${py312[@]}" -d "$work/deps" "${pins[@]}"

python3 -m pip download -q --no-deps "${py312[@]}" -d "$work" "$(pinned ray)"
mkdir "$work/ray"
(cd "$work/ray" && unzip -q "$work"/ray-*.whl \
  && rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/tune ray/train ray/data ray/llm \
  && tar cf - ray ray-*.dist-info) | xz -T0 -6 >"$work/ray.txz"

rm -rf "$OUT"; mkdir -p "$OUT"
(cd "$work" && split -b "$PART_BYTES" -d ray.txz ray.txz.part_)
parts=("$work"/ray.txz.part_*)
n=${#parts[@]}
for i in $(seq 1 "$n"); do
  mkdir -p "$OUT/r$i/deps"
  mv "${parts[$((i - 1))]}" "$OUT/r$i/"
  cat >"$OUT/r$i/stage.sh" <<'SH'
#!/usr/bin/env bash
# On the device: keep this carry's part of Ray (and its wheels) in /tmp/ray_stage.
set -euo pipefail
mkdir -p /tmp/ray_stage/deps
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cp "$here"/ray.txz.part_* /tmp/ray_stage/
cp "$here"/deps/*.whl /tmp/ray_stage/deps/ 2>/dev/null || true
echo "staged $(ls /tmp/ray_stage | grep -c part_) part(s) of Ray"
SH
done
# the wheels go with the smallest part, so every carry stays under the limit
i=0; for f in $(ls -S "$work"/deps/*.whl); do
  mv "$f" "$OUT/r$(( n - (i % n) ))/deps/"; i=$((i + 1))
done

cat >"$OUT/r$n/device_install.sh" <<SH
#!/usr/bin/env bash
# On the device, after every part's stage.sh: Ray into /tmp/site, and the wheels it lacks.
set -euo pipefail
S=/tmp/ray_stage; SITE=/tmp/site
[ "\$(ls "\$S" | grep -c part_)" = "$n" ] || { echo "stage all $n parts first (found \$(ls "\$S" | grep -c part_))" >&2; exit 1; }
mkdir -p "\$SITE"
cat "\$S"/ray.txz.part_* | xz -dc | tar xf - -C "\$SITE"
SH
cat >>"$OUT/r$n/device_install.sh" <<'SH'
# a wheel is installed only where the machine (or /tmp/site) has no such package, or an older one
missing=$(PYTHONPATH=$SITE python3 - "$S"/deps/*.whl <<'PY'
import importlib.metadata as md
import re
import sys

from packaging.version import Version

for wheel in sys.argv[1:]:
    name, version = wheel.rsplit("/", 1)[-1].split("-")[:2]
    try:
        have = md.version(re.sub(r"[-_.]+", "-", name).lower())
    except md.PackageNotFoundError:
        print(wheel)
        continue
    if Version(have) < Version(version):
        print(wheel)
PY
)
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086  # one wheel path per word
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" $missing
fi
PYTHONPATH=$SITE python3 -c "import ray, ray.serve; print('ray', ray.__version__, 'with serve ready in', '$SITE')"
SH
chmod +x "$OUT"/r*/stage.sh "$OUT/r$n/device_install.sh"
du -sh "$OUT"/r*
echo "carry, one device call each: $(for i in $(seq 1 "$n"); do printf '%s ' "$OUT/r$i"; done)"
