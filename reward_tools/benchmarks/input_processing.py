"""What vLLM's input processing costs per episode in the server (VllmEngine.prepare: the chat
template and tokenizer; InputHarness.render: the HF processor, vLLM's prompt update), one episode
after another on one thread.

    python -m reward_tools.benchmarks.input_processing --model-path CKPT [--episodes 32] [--frames 16] [--size 256]
        [--raw-pixels] [--points K [--partial-groups tail|shifted]] [--top 15] [--profile-out FILE]
        [--concurrent 2,4,8 [--repeats 3]] [--ab skip,call,skip_t4 [--repeats 4]] [--out FILE]
        [--engine-flags "SERVER FLAGS"]

Episodes take the server's path after the body is read: synthetic frames resized onto the grid
(`prepare_raw`), the profile's prompt, `VllmEngine.prepare`, then the timed render. The model is
not run, so a tiny checkpoint with the 7B's processor measures what a 7B server's input threads
do. `--raw-pixels` asks for uint8 patches, as the GPU default does (vllm_pixel_norm). `--top N`
adds cProfile's N costliest functions over all of them, by their own time and by the time
inside them; `--profile-out` writes the whole profile for `pstats` (cumulative times). Prints
JSON (and writes it to `--out`; vLLM's own log goes to stdout too).

`--ab ROWS` runs settings of the input side in turn on one thread, `--repeats` rounds in
alternating order, every row on the same episodes: `skip` and `call` (vllm_cache_hits on and
off), `_tN` the server's torch threads. Each row's engine inputs are digested (token ids,
placeholders, tensors' bytes), and `engine_inputs_alike` counts those every row produced the
same: a setting that changes what reaches the engine shows there.

`--concurrent T1,T2,...` measures what the server does with a whole batch instead: all the episodes
(or curves) at once through the engine's input pool of T threads (`preprocess_threads`), each
request prepared and processed in one pool job as the engine does (`InputHarness.process`), side by
side with the former split that prepared each request on the event loop (`loop`), repeated
(`--repeats`, new episodes each time, the two placements in alternating order). It prints each
row's wall time per episode, the CPU time
the process spent per episode (all its threads), and how late the event loop ran a 1 ms timer
meanwhile: the loop is what hands processed inputs to vLLM.

`--points K` measures a progress curve's K points per episode instead (Profile.build_curve, the
clips' ids as vllm_curves gives them, the longest point of each chain of clips first, then the
others, whose clips hit vLLM's processor cache), as the server's input threads do for one curve:
the times are per curve, and `render_ms_by_point_kind` splits the render time into the longest
points, the points that end inside a temporal group with a tail clip of their own and the points
whose clips are all shared. `--partial-groups shifted` builds the curves as
`--progress-partial-groups shifted` does (no tails: a second chain).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import pstats
import shlex
import statistics
import threading
import time

from reward_protocol.score import DEFAULT_MAX_PIXELS, BackendKwargs
from reward_server import cli
from reward_server.bootstrap import build_profile, engine_config
from reward_server.core.warmup import WARMUP_TASK, synthetic_episode
from reward_server.engines.vllm.curves import assign_clip_ids, leaders_first
from reward_server.engines.vllm.engine import VllmEngine
from reward_server.engines.vllm.harness import InputHarness
from reward_server.media.decoding import prepare_raw


async def run(args: argparse.Namespace) -> dict:
    flags = ["--engine", "vllm", "--model-path", args.model_path, "--no-warmup", *shlex.split(args.engine_flags)]
    settings = cli.parse_settings([*flags, "--progress-partial-groups", args.partial_groups])
    profile = build_profile(settings)
    engine = VllmEngine(engine_config(settings))
    await engine.start()
    # uint8 patches as on a GPU, where the workers normalize them (the CPU engine has no such workers)
    harness = InputHarness(engine)
    harness.ask_raw_pixels(args.raw_pixels)
    try:

        def build(seeds: range, tag: str = "") -> list[list]:
            """Each episode's requests (a curve's points: the longest first, as vllm_curves); `tag`
            makes the item ids new for episodes built again."""
            episodes = []
            for seed in seeds:
                video = prepare_raw(
                    synthetic_episode(args.frames, args.size, seed), args.frames, DEFAULT_MAX_PIXELS, profile.frame_spec
                )
                kwargs = BackendKwargs(score_mode="logprob")
                if args.points:
                    requests = profile.build_curve(WARMUP_TASK, video, kwargs, "logprob", args.points)
                    assign_clip_ids(requests, f"curve{seed}{tag}")
                    leaders, others = leaders_first(requests)  # as run_curve: each chain's longest first
                    episodes.append((leaders, others))
                else:
                    episodes.append(([profile.build(WARMUP_TASK, video, kwargs, "logprob")], []))
            return episodes

        if args.concurrent:
            return await concurrent(engine, build, args)
        episodes = build(range(args.episodes + 1))

        def kind(request: object, requests: list) -> str:
            """A curve's point: the longest of a chain of clips that other points share (processed
            first), one whose last clip is its own (a tail: it ends inside a temporal group), or
            one whose clips a longest point already brought."""
            chain = [r for r in requests if r.clip_ids[0] == request.clip_ids[0]]
            if len(chain) > 1 and request is max(chain, key=lambda r: len(r.clip_ids)):
                return "longest"
            last = request.clip_ids[-1]
            return "tail" if sum(last in other.clip_ids for other in requests) == 1 else "shared"

        def process(
            episode: tuple[list, list], inputs_out: list | None = None
        ) -> tuple[float, float, dict, dict[str, float]]:
            """One episode's requests prepared and rendered, leaders first: (prepare ms, render ms,
            last prompt, render ms by kind of curve point); each engine input appended to
            `inputs_out` if given."""
            requests = [*episode[0], *episode[1]]
            prepare_s = render_s = 0.0
            by_kind: dict[str, float] = {}
            for request in requests:
                start = time.perf_counter()
                inputs, params = engine.prepare(request)
                rendered = time.perf_counter()
                prompt = harness.render(inputs, params)
                prepare_s += rendered - start
                took = time.perf_counter() - rendered
                if inputs_out is not None:
                    inputs_out.append(prompt)
                render_s += took
                if args.points:
                    name = kind(request, requests)
                    by_kind[name] = by_kind.get(name, 0.0) + took * 1000
            return prepare_s * 1000, render_s * 1000, prompt, by_kind

        if args.ab:
            return ab_rows(args, build, process)
        process(episodes[0])  # the first one pays one-time costs: not counted
        profiler = cProfile.Profile() if args.top or args.profile_out else None
        prepares, times, kinds = [], [], []
        for episode in episodes[1:]:
            if profiler:
                profiler.enable()
            prepare_ms, render_ms, prompt, by_kind = process(episode)
            if profiler:
                profiler.disable()
            prepares.append(prepare_ms)
            times.append(render_ms)
            kinds.append(by_kind)
        result = {
            **batch_shape(args),
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
        if profiler and args.profile_out:  # every function, for pstats' cumulative view
            profiler.dump_stats(args.profile_out)
        if profiler and args.top:
            stats = pstats.Stats(profiler)
            result["top_own_ms_per_episode"] = top_functions(stats, args.top, len(times), "own")
            # and by the time spent inside each (callees included): where two vLLM versions or two
            # hosts differ, whatever the functions are called there
            result["top_cumulative_ms_per_episode"] = top_functions(stats, args.top, len(times), "cumulative")
        return result
    finally:
        await engine.shutdown()


def batch_shape(args: argparse.Namespace) -> dict:
    """What every result names: the episodes and their frames, raw pixels or not, points."""
    return {k: getattr(args, k) for k in ("episodes", "frames", "size", "raw_pixels", "points")}


def top_functions(stats: pstats.Stats, count: int, episodes: int, by: str) -> list[dict]:
    """cProfile's `count` costliest functions by their own time (`by` "own") or the time inside
    them ("cumulative"), per episode."""
    column = 2 if by == "own" else 3  # pstats' (calls, calls, own time, cumulative time, callers)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][column], reverse=True)[:count]  # type: ignore[attr-defined]
    return [
        {
            "function": f"{path.rsplit('site-packages/', 1)[-1]}:{line} {name}",
            f"{by}_ms": round(times[column] * 1000 / episodes, 3),
            "calls": times[1] // episodes,
        }
        for (path, line, name), times in rows
    ]


# `--ab` rows: whether a request whose items are all cached calls the HF processor (vllm_cache_hits),
# and the server's torch threads while it processes (the engine sets 1 on GPUs: vllm_threads)
AB_ROWS = {"skip": (True, None), "call": (False, None), "skip_t2": (True, 2), "skip_t4": (True, 4)}


def input_digest(engine_input: dict, curve_id: str) -> str:
    """What an engine input holds, as one hash: token ids, placeholders, every tensor's bytes; its
    items' hashes only as which items share one (vLLM derives them from the ids, new per row), and
    neither the curve's own id nor the arrival time (so the same episode processed again under
    another id digests the same)."""
    import hashlib

    import numpy as np
    import torch

    def walk(value: object, depth: int = 0) -> object:
        if depth > 16:
            return "..."
        if isinstance(value, torch.Tensor):
            data = value.detach().cpu().contiguous().flatten().view(torch.uint8).numpy()
            return ("tensor", tuple(value.shape), str(value.dtype), hashlib.sha1(data.tobytes()).hexdigest())
        if isinstance(value, np.ndarray):
            return ("array", value.shape, value.dtype.str, hashlib.sha1(value.tobytes()).hexdigest())
        if isinstance(value, str):
            return value.replace(curve_id, "C")
        if hasattr(value, "items"):  # dicts and vLLM's mappings
            return tuple(sorted((str(k), walk(v, depth + 1)) for k, v in value.items()))
        if isinstance(value, (list, tuple)):
            return tuple(walk(v, depth + 1) for v in value)
        if hasattr(value, "__dict__"):
            return (type(value).__name__, walk(vars(value), depth + 1))
        return repr(value)

    held = {key: value for key, value in engine_input.items() if key != "arrival_time"}
    if "mm_hashes" in held:
        seen: dict[str, int] = {}
        held["mm_hashes"] = {
            kind: [seen.setdefault(h, len(seen)) for h in hashes] for kind, hashes in held["mm_hashes"].items()
        }
    return hashlib.sha1(repr(walk(held)).encode()).hexdigest()


def ab_rows(args: argparse.Namespace, build, process) -> dict:
    """Each `--ab` row in turn, `--repeats` rounds in alternating order, one thread: every row
    processes the same episodes (new item ids per row, so nothing is a hit across rows). Per row
    the median render ms per curve and by kind of point; and how many engine inputs every row
    produced alike (input_digest), which must be all of them."""
    import torch

    from reward_server.engines.vllm import cache_hits as vllm_cache_hits

    names = [name.strip() for name in args.ab.split(",")]
    unknown = [name for name in names if name not in AB_ROWS]
    if unknown:
        raise SystemExit(f"--ab: unknown rows {unknown}; allowed {', '.join(AB_ROWS)}")
    threads = torch.get_num_threads()
    times: dict[str, list[float]] = {name: [] for name in names}
    kinds: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    same = compared = 0
    for round_ in range(args.repeats):
        seeds = range(1000 * (round_ + 1), 1000 * (round_ + 1) + args.episodes + 1)
        digests: dict[str, list[str]] = {}
        for name in names if round_ % 2 == 0 else names[::-1]:
            skip, torch_threads = AB_ROWS[name]
            (vllm_cache_hits.install if skip else vllm_cache_hits.uninstall)()
            torch.set_num_threads(torch_threads or threads)
            episodes = build(seeds, tag=f"-{name}-{round_}")
            digests[name] = []
            for index, episode in enumerate(episodes):
                inputs: list = []
                _prepare_ms, render_ms, _prompt, by_kind = process(episode, inputs)
                curve_id = f"curve{seeds[index]}-{name}-{round_}"
                digests[name].extend(input_digest(i, curve_id) for i in inputs)
                if index:  # the first one pays one-time costs: not counted
                    times[name].append(render_ms)
                    kinds[name].append(by_kind)
        torch.set_num_threads(threads)
        for row in zip(*digests.values(), strict=True):
            compared += 1
            same += len(set(row)) == 1
    return {
        **batch_shape(args),
        "rounds": args.repeats,
        "rows": {
            name: {
                "render_ms_median": round(statistics.median(times[name]), 2),
                "render_ms_by_point_kind": {
                    kind: round(statistics.median(k.get(kind, 0.0) for k in kinds[name]), 2)
                    for kind in ("longest", "tail", "shared")
                },
            }
            for name in names
        },
        "engine_inputs_compared": compared,
        "engine_inputs_alike": same,
    }


async def concurrent(engine: VllmEngine, build, args: argparse.Namespace) -> dict:
    """The batch at once through the engine's input pool: each row's wall and CPU time per episode
    and the event loop's lateness (see the module's notes)."""
    loop = asyncio.get_running_loop()
    harness = InputHarness(engine)
    prepared_in: set[str] = set()  # the threads that ran VllmEngine.prepare in the row being measured
    prepare = engine.prepare

    def recorded(request):
        prepared_in.add(threading.current_thread().name.rsplit("_", 1)[0])  # vllm-inputs_3 -> vllm-inputs
        return prepare(request)

    engine.prepare = recorded  # type: ignore[method-assign]

    async def on_loop(request) -> None:  # the former split: prepared on the loop, processed in the pool
        inputs, params = engine.prepare(request)
        await loop.run_in_executor(harness.input_pool, harness.render, inputs, params)

    async def in_pool(request) -> None:  # the engine's own (InputHarness.process)
        await harness.process(request)

    async def episode(one, leaders: list, others: list) -> None:  # a curve: the others once its leaders are processed
        await asyncio.gather(*(one(r) for r in leaders))
        await asyncio.gather(*(one(r) for r in others))

    async def timed(one, episodes: list[tuple[list, list]]) -> tuple[float, float, list[float]]:
        lateness: list[float] = []
        done = asyncio.Event()

        async def ticker() -> None:
            while not done.is_set():
                start = time.perf_counter()
                await asyncio.sleep(0.001)
                lateness.append((time.perf_counter() - start - 0.001) * 1000)

        tick = asyncio.ensure_future(ticker())
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(episode(one, *requests) for requests in episodes))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        done.set()
        await tick
        return wall, cpu, lateness

    rows = []
    seed = 0
    for threads in args.concurrent:
        harness.replace_input_pool(threads)  # the engine's own pool, then each row's
        await timed(in_pool, build(range(seed, seed + 2)))  # the pool's threads started, one-time costs paid
        seed += 2
        placements = {"loop": on_loop, "pool": in_pool}
        walls: dict[str, list[float]] = {name: [] for name in placements}
        cpus: dict[str, list[float]] = {name: [] for name in placements}
        late: dict[str, list[float]] = {name: [] for name in placements}
        threads_of: dict[str, set[str]] = {}
        for repeat in range(args.repeats):  # new episodes every time; the two placements in alternating order
            for name in sorted(placements, reverse=bool(repeat % 2)):
                prepared_in.clear()
                wall, cpu, lateness = await timed(placements[name], build(range(seed, seed + args.episodes)))
                seed += args.episodes
                walls[name].append(wall * 1000 / args.episodes)
                cpus[name].append(cpu * 1000 / args.episodes)
                late[name].extend(lateness)
                threads_of.setdefault(name, set()).update(prepared_in)
        for name in placements:
            late[name].sort()
            rows.append(
                {
                    "threads": threads,
                    "prepared_on": name,
                    "ms_per_episode_median": round(statistics.median(walls[name]), 2),
                    "ms_per_episode": [round(w, 2) for w in walls[name]],
                    "cpu_ms_per_episode_median": round(statistics.median(cpus[name]), 2),
                    "loop_late_ms_median": round(statistics.median(late[name]), 2),
                    "loop_late_ms_p90": round(late[name][int(len(late[name]) * 0.9)], 2),
                    "prepared_in": sorted(threads_of[name]),
                }
            )
            logging.getLogger(__name__).info("%s", rows[-1])
    return {
        **batch_shape(args),
        "repeats": args.repeats,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--raw-pixels", action="store_true")
    parser.add_argument("--points", type=int, default=0, help="a progress curve of K points per episode")
    parser.add_argument(
        "--partial-groups",
        choices=["tail", "shifted"],
        default="tail",
        help="--points: how a point that ends inside a frame group shows it (--progress-partial-groups)",
    )
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--profile-out", help="also write cProfile's stats of the timed episodes here")
    parser.add_argument(
        "--concurrent",
        type=lambda text: [int(t) for t in text.split(",")],
        help="the whole batch at once through an input pool of each of these thread counts (e.g. 2,4,8)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="--concurrent: batches per row; --ab: rounds")
    parser.add_argument(
        "--ab",
        help=f"rows side by side on one thread, in turn, the same episodes: some of {', '.join(AB_ROWS)} "
        "(skip/call: vllm_cache_hits on or off; _tN: the server's torch threads)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument(
        "--engine-flags",
        default="",
        help="more server flags for the engine, e.g. '--enforce-eager --max-model-len 8192'",
    )
    args = parser.parse_args()
    text = json.dumps(asyncio.run(run(args)), indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
