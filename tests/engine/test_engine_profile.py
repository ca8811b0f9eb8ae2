"""vLLM's torch profiler on the server's path (engines/vllm/profiler.py): a server started with
`--engine-option profile_dir=DIR` traces its engine between POST /start_profile and /stop_profile,
and `reward_tools.bench --trace` runs one more batch inside that window. On the CPU machines the
trace holds the engine's steps but no GPU work, which reward_tools.gpu_trace says."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import httpx

from tests.helpers.scripts import failure_text
from tests.helpers.servers import CPU_PRESET


def test_bench_trace_writes_the_engines_trace_of_one_more_batch(tiny_checkpoint, tmp_path):
    traces, out = tmp_path / "traces", tmp_path / "bench.json"
    launch = f"--config {CPU_PRESET} --engine vllm --model-path {tiny_checkpoint} --engine-option profile_dir={traces}"
    args = ["--launch", launch, "--paths", "hook_raw", "--n", "2", "--styles", "logprob", "--frames", "4"]
    proc = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench", *args, "--size", "56", "--repeats", "1", "--trace"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, failure_text(proc.stderr)
    (row,) = json.loads(out.read_text())["results"]  # bench.json, written in its working directory
    assert row["errors"] == 0 and row["traced"]["errors"] == 0 and row["traced"]["wall_s"] > 0
    files = [p for p in traces.rglob("*") if p.name.endswith(".json.gz")]
    assert files, list(traces.rglob("*"))
    with gzip.open(files[0], "rt") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    # the engine's own steps are in it (Python calls with their stacks), the server's process is not traced
    assert any("execute_model" in name for name in names)
    gpu = subprocess.run([sys.executable, "-m", "reward_tools.gpu_trace", str(traces)], capture_output=True, text=True)
    assert gpu.returncode != 0 and "no GPU events" in gpu.stderr


def test_profiling_is_refused_with_what_to_do_when_it_is_off(vllm_server):
    answer = httpx.post(f"{vllm_server.url}/start_profile", timeout=30)
    assert answer.status_code == 400
    assert "--engine-option profile_dir=DIR" in answer.json()["error"]["message"]
