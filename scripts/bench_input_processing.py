"""What vLLM's input processing costs per episode in the server (VllmEngine.prepare: the chat
template and tokenizer; VllmEngine._render: the HF processor, vLLM's prompt update), one episode
after another on one thread.

    python scripts/bench_input_processing.py --model-path CKPT [--episodes 32] [--frames 16] [--size 256]
        [--raw-pixels] [--points K] [--top 15] [--out FILE]

Episodes take the server's path after the body is read: synthetic frames resized onto the grid
(`prepare_raw`), the profile's prompt, `VllmEngine.prepare`, then the timed render. The model is
not run, so a tiny checkpoint with the 7B's processor measures what a 7B server's input threads
do. `--raw-pixels` asks for uint8 patches, as the GPU default does (vllm_pixel_norm). `--top N`
adds cProfile's N costliest functions (own time) over all of them. Prints JSON (and writes it to
`--out`; vLLM's own log goes to stdout too).

`--points K` measures a progress curve's K points per episode instead (Profile.build_curve, the
clips' ids as vllm_curves gives them, the longest point first, then the others, whose clips hit
vLLM's processor cache), as the server's input threads do for one curve: the times are per curve,
and `render_ms_by_point_kind` splits the render time into the longest point, the points that end
inside a temporal group (each brings a tail clip of its own) and the points whose clips are all
shared.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import time

from reward_client.protocol import DEFAULT_MAX_PIXELS, BackendKwargs
from reward_server import cli
from reward_server.bootstrap import build_profile, engine_config
from reward_server.core.warmup import WARMUP_TASK, synthetic_episode
from reward_server.engines.vllm_curves import assign_clip_ids
from reward_server.engines.vllm_engine import VllmEngine
from reward_server.engines.vllm_pixel_norm import RAW_PIXELS
from reward_server.media.decoding import prepare_raw


async def run(args: argparse.Namespace) -> dict:
    settings = cli.parse_settings(["--engine", "vllm", "--model-path", args.model_path, "--no-warmup"])
    profile = build_profile(settings)
    engine = VllmEngine(engine_config(settings))
    await engine.start()
    try:
        episodes = []
        for seed in range(args.episodes + 1):
            video = prepare_raw(
                synthetic_episode(args.frames, args.size, seed), args.frames, DEFAULT_MAX_PIXELS, profile.frame_spec
            )
            kwargs = BackendKwargs(score_mode="logprob")
            if args.points:
                requests = profile.build_curve(WARMUP_TASK, video, kwargs, "logprob", args.points)
                assign_clip_ids(requests, f"curve{seed}")
                episodes.append([requests[-1], *requests[:-1]])  # the longest first, as vllm_curves
            else:
                episodes.append([profile.build(WARMUP_TASK, video, kwargs, "logprob")])

        def kind(request: object, requests: list) -> str:
            """A curve's point: the longest (processed first), one whose last clip is its own (a
            tail: it ends inside a temporal group), or one whose clips the longest already brought."""
            if request is requests[0]:
                return "longest"
            last = request.clip_ids[-1] if request.clip_ids else None
            shown = sum(last in other.clip_ids for other in requests)
            return "tail" if shown == 1 else "shared"

        def process(requests: list) -> tuple[float, float, dict, dict[str, float]]:
            """One episode's requests prepared and rendered: (prepare ms, render ms, last prompt,
            render ms by kind of curve point)."""
            prepare_s = render_s = 0.0
            by_kind: dict[str, float] = {}
            for request in requests:
                start = time.perf_counter()
                inputs, params = engine.prepare(request)
                if args.raw_pixels:
                    inputs["mm_processor_kwargs"] = dict(RAW_PIXELS)
                rendered = time.perf_counter()
                prompt = engine._render(inputs, params, None)
                prepare_s += rendered - start
                took = time.perf_counter() - rendered
                render_s += took
                if args.points:
                    name = kind(request, requests)
                    by_kind[name] = by_kind.get(name, 0.0) + took * 1000
            return prepare_s * 1000, render_s * 1000, prompt, by_kind

        process(episodes[0])  # the first one pays one-time costs: not counted
        profiler = cProfile.Profile() if args.top else None
        prepares, times, kinds = [], [], []
        for requests in episodes[1:]:
            if profiler:
                profiler.enable()
            prepare_ms, render_ms, prompt, by_kind = process(requests)
            if profiler:
                profiler.disable()
            prepares.append(prepare_ms)
            times.append(render_ms)
            kinds.append(by_kind)
        result = {
            "episodes": args.episodes,
            "frames": args.frames,
            "size": args.size,
            "raw_pixels": args.raw_pixels,
            "points": args.points,
            "prompt_tokens": len(prompt.get("prompt_token_ids") or ()),
            "prepare_ms_median": round(statistics.median(prepares), 2),
            "render_ms_median": round(statistics.median(times), 2),
            "render_ms_max": round(max(times), 2),
        }
        if args.points:  # where a curve's render time goes: its points by kind (kind() above), per curve
            result["render_ms_by_point_kind"] = {
                name: round(statistics.median(k.get(name, 0.0) for k in kinds), 2)
                for name in ("longest", "tail", "shared")
            }
        if profiler:
            stats = pstats.Stats(profiler)
            rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[: args.top]
            result["top_own_ms_per_episode"] = [
                {
                    "function": f"{path.rsplit('site-packages/', 1)[-1]}:{line} {name}",
                    "own_ms": round(tt * 1000 / len(times), 3),
                    "calls": nc // len(times),
                }
                for (path, line, name), (_cc, nc, tt, _ct, _callers) in rows
            ]
        return result
    finally:
        await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--raw-pixels", action="store_true")
    parser.add_argument("--points", type=int, default=0, help="a progress curve of K points per episode")
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    text = json.dumps(asyncio.run(run(args)), indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
