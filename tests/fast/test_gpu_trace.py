"""reward_tools.gpu_trace: the GPU's busy time, the vision encoder's share and the idle gaps of a
torch-profiler trace. GPU traces come from a lent GPU only, so the GPU case is a small trace in the
profiler's Chrome-trace format, written here; the CPU case is a real torch-profiler trace."""

from __future__ import annotations

import gzip
import json

import pytest

from reward_tools import gpu_trace

ENCODER = "vllm/v1/worker/gpu_model_runner.py(2892): _execute_mm_encoder"


def _launch(corr: int, ts: float) -> dict:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 7,
        "tid": 1,
        "ts": ts,
        "dur": 2,
        "args": {"correlation": corr},
    }


def _kernel(corr: int, name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def test_busy_time_encoder_share_and_gaps(tmp_path):
    events = [
        # the encoder's CPU call, 0-100 us, launches kernels 1 and 2; kernel 3 is the language model's
        {"ph": "X", "cat": "python_function", "name": ENCODER, "pid": 7, "tid": 1, "ts": 0, "dur": 100},
        _launch(1, 10),
        _launch(2, 20),
        _launch(3, 150),
        _kernel(1, "vit_gemm", 1000, 400),
        _kernel(2, "vit_attn", 1300, 300),  # overlaps the first on another stream: busy counts it once
        _kernel(3, "llm_gemm", 5000, 2000, stream=8),  # after 3.4 ms idle
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 7000, "dur": 500},
        # what the launching thread did during the gap (1600-5000 us): a concatenation inside vLLM's batching
        {
            "ph": "X",
            "cat": "python_function",
            "name": "inputs.py(535): _reduce_data",
            "pid": 7,
            "tid": 1,
            "ts": 1500,
            "dur": 3000,
        },
        {
            "ph": "X",
            "cat": "python_function",
            "name": "<built-in method concat of type object at 0x7f>",
            "pid": 7,
            "tid": 1,
            "ts": 1600,
            "dur": 2900,
        },
        # inside the concatenation, the thread waits in a pinned-memory allocation
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaHostAlloc", "pid": 7, "tid": 1, "ts": 2000, "dur": 2400},
        {"ph": "X", "cat": "python_function", "name": "core.py(1): step", "pid": 7, "tid": 1, "ts": 0, "dur": 9000},
        {"ph": "X", "cat": "python_function", "name": "other.py(1): idle", "pid": 7, "tid": 2, "ts": 3000, "dur": 100},
    ]
    path = tmp_path / "worker.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    out = tmp_path / "report.json"
    assert gpu_trace.main([str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["window_ms"] == pytest.approx(6.5)  # 1000 us to 7500 us
    assert report["busy_ms"] == pytest.approx(3.1)  # 0.6 (the two encoder kernels) + 2.0 + 0.5
    assert report["idle_ms"] == pytest.approx(3.4) and report["gaps"] == 1
    assert report["kernel_ms"] == pytest.approx(2.7) and report["memcpy_ms"] == pytest.approx(0.5)
    assert report["encoder_kernel_ms"] == pytest.approx(0.7) and report["encoder_calls"] == 1
    assert [k["name"] for k in report["top_kernels"]] == ["llm_gemm", "vit_gemm", "vit_attn"]
    (gap,) = report["gap_causes"]  # named by the thread that launched kernel 3, innermost frame first
    assert gap == {
        "ms": pytest.approx(3.4),
        "at_ms": pytest.approx(0.6),
        "cpu": "inputs.py(535): _reduce_data > <built-in method concat of type object",
        "runtime": "cudaHostAlloc",
    }
    assert report["largest_gaps_ms"] == [pytest.approx(3.4)]
    # runtime calls by total time: the allocation first, then the three launches
    assert [(c["name"], c["count"]) for c in report["runtime_calls"]] == [("cudaHostAlloc", 1), ("cudaLaunchKernel", 3)]
    assert report["runtime_calls"][0]["longest_ms"] == pytest.approx(2.4)
    # all idle summed by its cause (here the one gap), and per 100 ms of the window (one slice)
    assert report["idle_by_cause"] == [{"cpu": f"{gap['cpu']} [cudaHostAlloc]", "ms": pytest.approx(3.4), "gaps": 1}]
    assert report["idle_timeline_ms"] == [pytest.approx(3.4)]


def test_a_trace_without_gpu_work_is_named(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    prof.export_chrome_trace(str(tmp_path / "cpu.json"))
    with pytest.raises(SystemExit, match="no GPU events"):
        gpu_trace.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="no trace"):
        gpu_trace.main([str(tmp_path / "empty_dir_that_is_not_there")])
