"""Throughput of the reward server on the paths users run, side by side in one run.

    python -m reward_tools.bench --launch "--engine vllm --model-path DIR ..." --out bench.json
    python -m reward_tools.bench --url http://127.0.0.1:18080 --paths hook_raw hook_json --n 64
    python -m reward_tools.bench --peer-url http://127.0.0.1:8000 --peer-model DIR ...   (plain `vllm serve`)

Workload: episodes of 16 frames of 256x256 (max_pixels 200704, as LIBERO-10 runs send) and the
Qwen progress prompt or its logprob variant; every measurement uses episodes never sent before
(no engine cache helps). Scoring styles: `logprob` and `p_true` (prefill only) and `genK` (exactly K new
tokens: random weights need fixed output lengths). Paths, for N episodes ending together:

- `hook_raw`: what the RLinf hook sends by default: `RewardClient.score_episodes`, one raw batch
  body (frames as bytes); the client's encoding is inside the timing.
- `hook_json`: the same through `RewardClient.score_batch` (base64 frames in one JSON body).
- `hook_mp4`: the hook's `video_path` transport: each episode written as an MP4 on a shared disk
  (inside the timing), one raw batch of paths.
- `concurrent`: N concurrent `/score` requests (JSON), as clients that score one by one in parallel.
- `sequential`: the same N episodes one at a time (the seed's behaviour).
- `peer`: plain `vllm serve` (OpenAI chat API) with the same prompt text and the same 16 frames as
  an inline MP4 `video_url` (encoded at 2 fps outside the timing), N concurrent calls.

`--views 1 2` measures each path with episodes of one and of two camera views side by side (each
view its own frames, one clip per view in one prompt, as the hook sends `reward_model.views`);
the table's `ms/ep` (wall time per episode of the batch) and `tokens` (prompt tokens per episode)
are the cost per episode.

Every path, the peer's included, is first warmed by one unmeasured batch of its own episodes;
each measured batch has episodes no path was sent before; each row is the median of `--repeats`
batches (default 3). Prints one table (with the server's mean per-stage timings per episode) and
writes JSON.

`--first-batch` measures instead the first batch a server scores after it started (the hook
path, the first style and N, no warm-up call) against `--repeats` steady batches that follow, in
one run, and prints JSON: with `--launch`, the server is started for it (`--launch "... --no-warmup"`
shows what the start-up warm-up saves).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import platform
import secrets
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from reward_client.client import AsyncRewardClient, RetryPolicy, RewardClient
from reward_protocol.frames import to_grid
from reward_protocol.score import MAX_VIEWS, BackendKwargs, InlineFrames, ScoreOptions, ScoreRequest, ViewFrames

logger = logging.getLogger("reward_tools.bench")

TASKS = (
    "put both the alphabet soup and the tomato sauce in the basket",
    "turn on the stove and put the moka pot on it",
    "put the black bowl in the bottom drawer of the cabinet and close it",
    "pick up the book and place it in the back compartment of the caddy",
)
PATHS = ("hook_raw", "hook_json", "hook_mp4", "concurrent", "sequential", "peer")
STAGES = ("receive_ms", "prepare_ms", "engine_ms", "total_ms")
# inside engine_ms, where the engine says (vLLM): input processing, queue, prefill, decode
ENGINE_STAGES = ("input_ms", "queue_ms", "prefill_ms", "decode_ms")


@dataclass
class Result:
    path: str
    style: str
    n: int
    wall_s: float
    episodes_per_s: float
    errors: int
    stages: dict[str, float] = field(default_factory=dict)  # server-side means per episode
    request_mib: float = 0.0
    stages_max: dict[str, float] = field(default_factory=dict)  # server-side largest per episode
    window: tuple[float, float] = (0.0, 0.0)  # time.monotonic() at the batch's start and end (step logs)
    repeats_s: list[float] = field(default_factory=list)  # every repeat's wall time
    views: int = 1  # camera views per episode (one clip each in one prompt)
    prompt_tokens: float = 0.0  # mean per episode, as the server counted them
    # the stages of the episode whose bytes arrived first (the front of the batch)
    first: dict[str, float] = field(default_factory=dict)
    traced: dict | None = None  # --trace: the one more batch run under the engine's profiler


def episode(seed: int, frames: int = 16, size: int = 256) -> np.ndarray:
    """A LIBERO-sized episode: a textured table with a block moving across (not constant)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(60, 200, size=(size // 8, size // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    video = np.repeat(base[None], frames, axis=0)
    for t in range(frames):
        x = int((size - 40) * t / max(1, frames - 1))
        video[t, 100:140, x : x + 40] = (200, 30, 30)
    return video


def style_kwargs(style: str) -> BackendKwargs:
    if style in ("logprob", "p_true"):  # one prefill each: P(Yes) / P(True) of the next token
        return BackendKwargs(score_mode=style)
    if style.startswith("gen") and style[3:].isdigit():
        return BackendKwargs(max_tokens=int(style[3:]), ignore_eos=True, temperature=0.0)
    raise ValueError(f"unknown style {style!r}: logprob, p_true or genK (e.g. gen8, gen256)")


class Episodes:
    """Hands out episodes never sent before, so no measurement is helped by the engine's
    prefix or multimodal caches (every real episode is new). Two benchmark processes against one
    server must start from different seeds (`--first-seed`; by default a random one), or the
    second is served from the first one's caches."""

    def __init__(self, frames: int, size: int, first_seed: int = 0):
        self.frames, self.size, self.next_seed = frames, size, first_seed

    def take(self, n: int, views: int = 1) -> list:
        """n episodes; with views > 1 each is {camera name: frames} (every camera its own frames)."""
        seeds = range(self.next_seed, self.next_seed + n * views)
        self.next_seed += n * views
        videos = [episode(seed, self.frames, self.size) for seed in seeds]
        if views == 1:
            return videos
        return [{f"camera {v}": videos[i * views + v] for v in range(views)} for i in range(n)]


def _frames(video) -> list[np.ndarray]:
    """Every camera's frames of one episode (one view, or {camera name: frames})."""
    return list(video.values()) if isinstance(video, dict) else [video]


def _options(i: int, style: str, video) -> ScoreOptions:
    nframes = len(_frames(video)[0])
    return ScoreOptions(task_text=TASKS[i % len(TASKS)], nframes=nframes, backend_kwargs=style_kwargs(style))


def _inline(options: ScoreOptions, video) -> ScoreRequest:
    if isinstance(video, dict):
        views = [ViewFrames(name=k, frames=InlineFrames.from_array(v)) for k, v in video.items()]
        return ScoreRequest(**options.model_dump(), views=views)
    return ScoreRequest(**options.model_dump(), frames=InlineFrames.from_array(video))


def _timings(responses: list) -> list[dict]:
    return [r.timings.model_dump() for r in responses if r is not None]


def _first(timings: list[dict]) -> dict[str, float]:
    """The server's stages of the episode whose bytes arrived first (the front of a batch)."""
    if not timings:
        return {}
    first = min(timings, key=lambda t: t.get("receive_ms", 0.0))
    return {k: first.get(k, 0.0) for k in (*STAGES, *ENGINE_STAGES)}


def _pick(timings: list[dict], pick=statistics.fmean) -> dict[str, float]:
    return {k: pick(t.get(k, 0.0) for t in timings) for k in (*STAGES, *ENGINE_STAGES)} if timings else {}


class ServerPaths:
    """The server-side paths; each returns (wall seconds, responses or None per episode, request MiB)."""

    def __init__(self, url: str, video_dir: str, grid: bool = False):
        self.url = url
        self.video_dir = video_dir
        self.grid = grid  # the hook's `to_grid`: frames resized onto the model grid by the client
        policy = RetryPolicy(deadline_s=3600, timeout_s=3600)
        # several servers (comma-separated): the client splits each batch across them. The hook
        # paths use the blocking client, as the RLinf hook does (it sends a split batch's parts
        # from threads); the one-request-per-episode paths use the async client.
        self.client = AsyncRewardClient(url.split(","), policy)
        self.hook = RewardClient(url.split(","), policy)

    async def hook_raw(self, videos, style):
        started = time.perf_counter()
        if self.grid:  # in the timing: the env worker pays it
            videos = await asyncio.to_thread(lambda: [to_grid(v) for v in videos])
        episodes = [(_options(i, style, v), v) for i, v in enumerate(videos)]
        items = await asyncio.to_thread(self.hook.score_episodes, episodes)
        wall = time.perf_counter() - started
        mib = sum(f.nbytes for v in videos for f in _frames(v)) / 2**20
        return wall, [i.response for i in items], mib

    async def hook_json(self, videos, style):
        started = time.perf_counter()
        requests = [_inline(_options(i, style, v), v) for i, v in enumerate(videos)]
        items = await asyncio.to_thread(self.hook.score_batch, requests)
        wall = time.perf_counter() - started
        mib = sum(len(f.data_b64) for r in requests for f in ([r.frames] if r.frames else [v.frames for v in r.views]))
        mib /= 2**20
        return wall, [i.response for i in items], mib

    async def hook_mp4(self, videos, style):
        from reward_client.video_io import write_mp4

        started = time.perf_counter()
        paths = [
            write_mp4(v, os.path.join(self.video_dir, f"bench_{time.time_ns()}_{i}.mp4"), fps=2)
            for i, v in enumerate(videos)
        ]
        items = await self.client.score_episodes(
            [(_options(i, style, v), p) for i, (v, p) in enumerate(zip(videos, paths, strict=True))]
        )
        wall = time.perf_counter() - started
        mib = sum(os.path.getsize(p) for p in paths) / 2**20
        for p in paths:
            os.remove(p)
        return wall, [i.response for i in items], mib

    def _requests(self, videos, style) -> list[ScoreRequest]:
        return [_inline(_options(i, style, v), v) for i, v in enumerate(videos)]

    async def concurrent(self, videos, style):
        requests = self._requests(videos, style)  # encoded outside the timing, as before
        started = time.perf_counter()
        responses = await asyncio.gather(*(self.client.score(r) for r in requests), return_exceptions=True)
        wall = time.perf_counter() - started
        return wall, [r if not isinstance(r, Exception) else None for r in responses], 0.0

    async def sequential(self, videos, style):
        requests = self._requests(videos, style)
        started = time.perf_counter()
        responses = [await self.client.score(r) for r in requests]
        return time.perf_counter() - started, responses, 0.0

    async def close(self) -> None:
        await self.client.aclose()
        self.hook.close()


class PeerPath:
    """Plain `vllm serve` (OpenAI chat completions), the same prompt text and frames (as MP4)."""

    def __init__(self, url: str, model: str):
        from reward_server.profiles.qwen2_5_vl import LOGPROB_PROMPT, PROGRESS_PROMPT

        self.url, self.model = url.rstrip("/"), model
        self.prompts = {"logprob": LOGPROB_PROMPT, "gen": PROGRESS_PROMPT}
        self.answer_ids: list[int] | None = None
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(model)
            self.answer_ids = [tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No")]
        except Exception:  # the peer still runs; logprob then reads top logprobs unrestricted
            logger.warning("could not load the tokenizer of %s: logprob calls are not restricted", model)

    def _body(self, i: int, mp4: bytes, style: str) -> dict:
        task = TASKS[i % len(TASKS)]
        text = self.prompts["logprob" if style == "logprob" else "gen"].replace("{task}", task)
        content = [
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(mp4).decode()}},
            {"type": "text", "text": text},
        ]
        body: dict = {"model": self.model, "messages": [{"role": "user", "content": content}], "temperature": 0.0}
        if style == "logprob":
            body.update(max_tokens=1, logprobs=True, top_logprobs=2)
            if self.answer_ids:
                body["allowed_token_ids"] = self.answer_ids
        else:
            body.update(max_tokens=int(style[3:]), ignore_eos=True)
        return body

    async def peer(self, videos, style):
        from reward_client.video_io import encode_mp4

        bodies = [self._body(i, encode_mp4(v, fps=2), style) for i, v in enumerate(videos)]  # outside the timing
        limits = httpx.Limits(max_connections=len(bodies) + 4)
        async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(client.post(f"{self.url}/v1/chat/completions", json=b) for b in bodies), return_exceptions=True
            )
            wall = time.perf_counter() - started
        ok = [a if isinstance(a, httpx.Response) and a.status_code == 200 else None for a in answers]
        for a in answers:
            if not (isinstance(a, httpx.Response) and a.status_code == 200):
                logger.warning("peer call failed: %s", a if not isinstance(a, httpx.Response) else a.text[:300])
                break
        mib = sum(len(json.dumps(b)) for b in bodies) / 2**20
        return wall, [True if a is not None else None for a in ok], mib

    async def close(self) -> None:
        pass


async def run(
    paths: dict[str, Callable],
    styles: list[str],
    ns: list[int],
    repeats: int,
    frames: int,
    size: int,
    first_seed: int = 0,
    views: tuple[int, ...] = (1,),
    trace: Callable | None = None,
):
    """`trace(on)`: after each row's measured batches, one more batch of new episodes runs between
    trace(True) and trace(False) (the server's profiler), outside the median."""
    results = []
    episodes = Episodes(frames, size, first_seed)
    for style in styles:
        for name, fn in paths.items():
            for v in views:  # 1 and 2 views side by side: each measured batch of new episodes
                # warm-up, unmeasured: a whole batch of the largest size (kernels, graphs, connections,
                # the engine's batch shapes), with its own episodes; the peer is warmed the same way
                await fn(episodes.take(4 if name == "sequential" else max(ns), v), style)
                for n in ns:
                    runs = 1 if name == "sequential" else repeats
                    done = []
                    for _ in range(runs):
                        videos = episodes.take(n, v)
                        began = time.monotonic()
                        wall, responses, mib = await fn(videos, style)
                        window = (began, time.monotonic())
                        errors = sum(r is None for r in responses)
                        answered = [r for r in responses if r is not None and r is not True]
                        tokens = statistics.fmean(r.prompt_tokens or 0 for r in answered) if answered else 0.0
                        timings = _timings(answered)  # each episode's stages, dumped once for the three views
                        row = Result(name, style, n, wall, n / wall, errors, _pick(timings), mib, views=v)
                        row.stages_max, row.window, row.prompt_tokens = _pick(timings, max), window, tokens
                        row.first = _first(timings)
                        done.append(row)
                    median = sorted(done, key=lambda r: r.wall_s)[(len(done) - 1) // 2]  # the median repeat
                    median.repeats_s = [round(r.wall_s, 4) for r in done]
                    if trace is not None:
                        await trace(True)
                        began = time.monotonic()
                        wall, responses, _ = await fn(episodes.take(n, v), style)
                        median.traced = {
                            "wall_s": round(wall, 4),
                            "window": (began, time.monotonic()),
                            "errors": sum(r is None for r in responses),
                        }
                        await trace(False)
                    results.append(median)
                    logger.info("%s (repeats: %s)", median, [round(r.wall_s, 3) for r in done])
    return results


async def first_batch(
    paths: ServerPaths, style: str, n: int, repeats: int, frames: int, size: int, first_seed: int = 0
) -> dict:
    """The first batch the server sees, then `repeats` steady ones, all new episodes."""
    episodes = Episodes(frames, size, first_seed)
    walls, errors = [], 0
    for _ in range(1 + max(1, repeats)):
        wall, responses, _ = await paths.hook_raw(episodes.take(n), style)
        walls.append(wall)
        errors += sum(r is None for r in responses)
        logger.info("%s batch of %d: %.3f s", "first" if len(walls) == 1 else "steady", n, wall)
    steady = statistics.median(walls[1:])
    return {
        "path": "hook_raw",
        "style": style,
        "n": n,
        "first_s": walls[0],
        "steady_s": walls[1:],
        "steady_median_s": steady,
        "first_over_steady": walls[0] / steady,
        "errors": errors,
    }


def profiler(url: str) -> Callable:
    """trace(on): the server's POST /start_profile or /stop_profile; its error, if any, ends the run."""

    async def trace(on: bool) -> None:
        async with httpx.AsyncClient(timeout=600) as client:  # stopping writes the trace: may take a while
            answer = await client.post(f"{url}/{'start' if on else 'stop'}_profile")
        if answer.status_code != 200:
            raise SystemExit(f"bench --trace: {answer.status_code} {answer.text[:300]}")

    return trace


def table(results: list[Result]) -> str:
    lines = [
        f"{'path':<11} {'style':<8} {'N':>4} {'eps/s':>7} {'wall s':>7} {'views':>5} {'ms/ep':>7} {'tokens':>7} "
        f"{'err':>4} {'MiB':>7} " + " ".join(f"{s[:-3] + ' ms':>11}" for s in STAGES)
    ]
    for r in results:
        lines.append(
            f"{r.path:<11} {r.style:<8} {r.n:>4} {r.episodes_per_s:>7.2f} {r.wall_s:>7.2f} {r.views:>5} "
            f"{1000 * r.wall_s / r.n:>7.1f} {r.prompt_tokens:>7.0f} {r.errors:>4} {r.request_mib:>7.1f} "
            + " ".join(f"{r.stages.get(s, float('nan')):>11.1f}" for s in STAGES)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running reward server (several, comma-separated: the batch is split)")
    parser.add_argument("--launch", help="start a reward server with these flags (quoted), measure, stop it")
    parser.add_argument("--peer-url", help="a running `vllm serve` to measure with the same workload")
    parser.add_argument("--peer-model", help="the model name/path the peer serves (also its tokenizer)")
    parser.add_argument(
        "--paths", nargs="+", choices=PATHS, default=["hook_raw", "hook_json", "hook_mp4", "concurrent"]
    )
    parser.add_argument("--n", type=int, nargs="+", default=[64])
    parser.add_argument("--styles", nargs="+", default=["logprob", "gen8"])
    parser.add_argument("--repeats", type=int, default=3, help="measured batches per path (the median is reported)")
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument(
        "--views",
        type=int,
        nargs="+",
        default=[1],
        help="camera views per episode, side by side (e.g. 1 2): one clip per view in one prompt "
        "(hook_raw, hook_json, concurrent, sequential only)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=None,
        help="seed of the first episode (default: random, so a second run against the same server sends new episodes)",
    )
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument(
        "--to-grid", action="store_true", help="hook_raw: the client resizes frames onto the model grid (256 -> 252)"
    )
    parser.add_argument(
        "--first-batch",
        action="store_true",
        help="the first batch after the server started against --repeats steady ones (hook path, first style and N)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="after each row's repeats, one more batch traced by the server's engine profiler (a server "
        "started with --engine-option profile_dir=DIR: POST /start_profile, /stop_profile)",
    )
    args = parser.parse_args(argv)
    if args.trace and (args.peer_url or not (args.url or args.launch is not None)):
        parser.error("--trace traces the reward server's engine: use it with --url or --launch, without --peer-url")
    if args.first_batch and not (args.url or args.launch is not None):
        parser.error("--first-batch needs --launch (a server started for it) or --url")
    several = max(args.views) > 1 and {"hook_mp4", "peer"} & set(args.paths)
    if several or not all(1 <= v <= MAX_VIEWS for v in args.views):
        parser.error(f"--views: 1 to {MAX_VIEWS}; several views go as frames (not hook_mp4, not peer)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # episodes a million apart per run: a later run never repeats an earlier one's frames
    first_seed = args.first_seed if args.first_seed is not None else secrets.randbelow(2**20) * 1_000_000

    server = None
    url = args.url
    video_dir = tempfile.mkdtemp(prefix="reward-bench-")
    if args.launch is not None:
        from reward_tools.launch import ServerProcess

        flags = [*shlex.split(args.launch), "--video-root", video_dir]
        server = ServerProcess(flags, log_path=Path(args.out).with_suffix(".server.log"))
        server.start()
        server.wait_ready(args.startup_timeout)
        url = server.url
    report: dict = {
        "launch": args.launch,
        "workload": {
            "frames": args.frames,
            "size": args.size,
            "max_pixels": 200704,
            "to_grid": args.to_grid,
            "views": args.views,
        },
    }
    try:
        chosen: dict[str, Callable] = {}
        closers = []
        if url is not None:
            report["server"] = httpx.get(f"{url.split(',')[0]}/health", timeout=10).json()
            server_paths = ServerPaths(url, video_dir, grid=args.to_grid)
            closers.append(server_paths.close)
            chosen.update({p: getattr(server_paths, p) for p in args.paths if p != "peer"})
        if args.peer_url:
            peer = PeerPath(args.peer_url, args.peer_model or "")
            chosen["peer"] = peer.peer
        if args.first_batch:
            measure = first_batch(
                server_paths, args.styles[0], args.n[0], args.repeats, args.frames, args.size, first_seed
            )

            async def first():
                try:
                    return await measure
                finally:
                    await server_paths.close()

            report["first_batch"] = asyncio.run(first())
            report["first_batch"]["warmup"] = httpx.get(f"{url.split(',')[0]}/stats", timeout=10).json().get("warmup")
            report["host"] = {"python": platform.python_version(), "machine": platform.machine()}
            Path(args.out).write_text(json.dumps(report, indent=2))
            print(json.dumps(report["first_batch"], indent=2))
            return 1 if report["first_batch"]["errors"] else 0

        async def go():
            try:
                trace = profiler(url.split(",")[0]) if args.trace else None
                return await run(
                    chosen,
                    args.styles,
                    args.n,
                    args.repeats,
                    args.frames,
                    args.size,
                    first_seed,
                    tuple(args.views),
                    trace,
                )
            finally:
                for close in closers:
                    await close()

        results = asyncio.run(go())
        if url is not None:
            report["engine_stats"] = [httpx.get(f"{u}/stats", timeout=10).json() for u in url.split(",")]
    finally:
        if server is not None:
            server.stop()
    report["host"] = {"python": platform.python_version(), "machine": platform.machine()}
    report["results"] = [asdict(r) for r in results]
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(table(results))
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
