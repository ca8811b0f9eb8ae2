"""Is a batch of progress curves held back by how fast its prompts reach vLLM? The same kind of
batch two ways on one engine, side by side:

- `fed`, the server's path: every curve through `VllmEngine.generate_curve`, each point processed
  in the engine's input pool and handed to vLLM as soon as it is ready, so the engine schedules
  what has arrived while the rest is still being processed;
- `ready`: every point of every curve processed first (the same pool, the same order: the longest
  point of each chain of clips, then the others), then all handed to vLLM at once. Its `engine_s` is what the
  engine needs for the batch when nothing waits on input processing; `input_s` is that processing.

    python -m reward_tools.benchmarks.curve_feed [--points 1,16] [--episodes 64] [--repeats 3] [--out FILE] \
        -- --engine vllm --model-path CKPT [the server's engine flags]

If `fed` takes about `ready`'s `engine_s`, the engine is the limit and faster input processing
would not shorten the batch; if it takes about `input_s` or more, the feed is. Each K is warmed by
one unmeasured batch of each row; every batch has new episodes (synthetic, as the server's warm-up
makes them: `--frames` of `--size`, resized onto the model's grid); the rows alternate their order
across repeats. Per row: the median wall time, vLLM's steps that prefilled a prompt during it and
the most prompts one step prefilled (from the engine's step log), and answers that were not an
answer (none expected). Prints JSON (and writes it to `--out`); vLLM's own log goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from reward_protocol.score import DEFAULT_MAX_PIXELS, BackendKwargs
from reward_server import cli
from reward_server.bootstrap import build_profile, engine_config
from reward_server.core.warmup import WARMUP_TASK, synthetic_episode
from reward_server.engines.io import EngineRequest
from reward_server.engines.vllm.curves import assign_clip_ids, leaders_first
from reward_server.engines.vllm.engine import VllmEngine, request_failure
from reward_server.engines.vllm.harness import InputHarness
from reward_server.media.decoding import prepare_raw

logger = logging.getLogger("bench_curve_feed")
ROWS = ("fed", "ready")


def steps_between(log: Path, start: float, end: float) -> tuple[int, int]:
    """vLLM's steps that prefilled at least one prompt between two time.monotonic() readings, and
    the most prompts one of them prefilled (the engine's step log, vllm_engine._step_line)."""
    counts = []
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if start <= row["t"] <= end and row.get("prefilled"):
            counts.append(row["prefilled"])
    return len(counts), max(counts, default=0)


class FeedBench:
    def __init__(self, engine: VllmEngine, profile, args: argparse.Namespace, step_log: Path):
        self.engine, self.profile, self.args, self.step_log = engine, profile, args, step_log
        self.seeds = itertools.count()

    def curves(self, points: int) -> list[list[EngineRequest]]:
        """N new episodes' curves of K points (Profile.build_curve; K = 1 is the episode's one prompt)."""
        out = []
        for _ in range(self.args.episodes):
            seed = next(self.seeds)
            video = prepare_raw(
                synthetic_episode(self.args.frames, self.args.size, seed),
                self.args.frames,
                DEFAULT_MAX_PIXELS,
                self.profile.frame_spec,
            )
            requests = self.profile.build_curve(
                WARMUP_TASK, video, BackendKwargs(score_mode="logprob"), "logprob", points
            )
            for k, request in enumerate(requests):
                request.request_id = f"feed{seed}-p{k}"
            out.append(requests)
        return out

    async def fed(self, curves: list[list[EngineRequest]]) -> dict:
        start = time.monotonic()
        outputs = await asyncio.gather(*(self.engine.generate_curve(c) for c in curves), return_exceptions=True)
        end = time.monotonic()
        failed = sum(isinstance(o, BaseException) for o in outputs)
        return {"wall_s": end - start, "failed": failed, "window": (start, end)}

    async def ready(self, curves: list[list[EngineRequest]]) -> dict:
        harness = InputHarness(self.engine)

        async def process(curve: list[EngineRequest]) -> list[tuple[str, object, object]]:
            leaders, others = leaders_first(curve)  # as vllm_curves.run_curve: each chain's longest first
            if harness.curve_clip_ids:
                assign_clip_ids(curve, uuid.uuid4().hex)
            first = await asyncio.gather(*(harness.process(r) for r in leaders))
            rest = await asyncio.gather(*(harness.process(r) for r in others))
            return [
                (request.request_id, prompt, params)
                for request, (_inputs, params, prompt) in zip([*leaders, *others], [*first, *rest], strict=True)
            ]

        start = time.monotonic()
        processed = await asyncio.gather(*(process(c) for c in curves))
        handed = time.monotonic()
        # created in this order, each task hands its input to vLLM before it first waits, so each
        # chain's longest point reaches both halves of the processor cache before its other points
        finals = await asyncio.gather(
            *(harness.submit(rid, prompt, params) for curve in processed for rid, prompt, params in curve),
            return_exceptions=True,
        )
        end = time.monotonic()
        failed = sum(isinstance(f, BaseException) or request_failure(f) is not None for f in finals)
        return {
            "wall_s": end - start,
            "input_s": handed - start,
            "engine_s": end - handed,
            "failed": failed,
            "window": (handed, end),
        }

    async def point(self, points: int) -> dict:
        for name in ROWS:  # warm: one unmeasured batch of each row
            await getattr(self, name)(self.curves(points))
        runs: dict[str, list[dict]] = {name: [] for name in ROWS}
        for repeat in range(self.args.repeats):
            for name in sorted(ROWS, reverse=bool(repeat % 2)):
                run = await getattr(self, name)(self.curves(points))
                run["steps"], run["most_per_step"] = steps_between(self.step_log, *run.pop("window"))
                runs[name].append(run)
                logger.info("K=%d %s: %s", points, name, run)
        out: dict = {"points": points, "prompts": points * self.args.episodes}
        for name, done in runs.items():
            row = {
                key: round(statistics.median(r[key] for r in done), 3)
                for key in done[0]
                if key not in ("failed", "most_per_step")
            }
            row["wall_s_repeats"] = [round(r["wall_s"], 3) for r in done]
            row["most_per_step"] = max(r["most_per_step"] for r in done)
            row["failed"] = sum(r["failed"] for r in done)
            out[name] = row
        out["fed_over_ready_engine"] = round(out["fed"]["wall_s"] / out["ready"]["engine_s"], 3)
        return out


async def run(args: argparse.Namespace, server_argv: list[str]) -> dict:
    step_log = Path(tempfile.mkdtemp(prefix="curve_feed_")) / "steps.jsonl"
    settings = cli.parse_settings([*server_argv, "--no-warmup", "--engine-option", f"step_log={step_log}"])
    if settings.engine != "vllm":
        raise SystemExit(f"--engine {settings.engine}: this benchmark measures the vLLM engine (--engine vllm)")
    engine = VllmEngine(engine_config(settings))
    await engine.start()
    try:
        bench = FeedBench(engine, build_profile(settings), args, step_log)
        results = [await bench.point(k) for k in args.points]
    finally:
        await engine.shutdown()
    return {
        "episodes": args.episodes,
        "frames": args.frames,
        "size": args.size,
        "repeats": args.repeats,
        "server_flags": server_argv,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage="%(prog)s [options] -- SERVER FLAGS")
    parser.add_argument("--points", type=lambda t: [int(k) for k in t.split(",")], default=[1, 16])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON here")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if split == len(argv):
        parser.error("the server's flags go after `--` (at least --engine vllm --model-path CKPT)")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    text = json.dumps(asyncio.run(run(args, argv[split + 1 :])), indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
