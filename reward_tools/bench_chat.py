"""OpenAI chat requests of the shapes RL reward workers send, concurrently, against one or more servers.

    python -m reward_tools.bench_chat --url http://127.0.0.1:18080 --url http://127.0.0.1:8000 \\
        --shape seed --n 64 --shape history --n 512 --repeats 3 --out chat.json

A fair comparison: every server is first warmed by one unmeasured pass of every shape (its own
frames, never measured), then each shape is measured `--repeats` times (at least 3), every repeat
with frames no server has been sent before; the servers take turns within a repeat, and each
(server, shape) is reported by its median repeat. With two or more URLs, each later URL's
median wall time is also given over the first's (`vs_first`: > 1 means the first is faster).
Servers measured one after another (one GPU, one engine at a time) get the same schedule of
frames: run this once per server with the same --repeats and compare the medians (--report).

Shapes (every request carries frames no other request carries, so no cache helps):
- `seed`: the seed's ManiSkill reward worker: one user turn of 8 JPEG frames (quality 70) as
  `data:image/jpeg;base64,` URLs, then the `[[SCORE]]` question; temperature 0, max_tokens 16.
- `history`: RLinf's API reward worker in `history_buffer` mode: one window of 5 frames from
  each of 2 views (JPEG quality 95), then the question, its sampling parameters spread into the
  body; one request per sample from a thread pool, so a whole batch of envs arrives at once.

The same payloads go to every URL (this server, plain `vllm serve`, SGLang): each URL's served
model name is read from `GET /v1/models`. Prints JSON: wall time, requests per second, latency
p50 / p95 / max, status counts, and the mean prompt and completion tokens from `usage`, for the
median repeat, and every repeat's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np

logger = logging.getLogger("reward_tools.bench_chat")

TASK = "put the red cube on the green plate"
SEED_PROMPT = (
    "Task: {task}\n"
    "The images are frames of one robot rollout, in order. Did the robot complete the task? "
    "Answer with [[SCORE]] where SCORE is 1.0 for success and -1.0 for failure, e.g. [[1.0]]."
)
HISTORY_PROMPT = (
    "Task: {task}\n"
    "The first 5 images are the third-person view of the last steps, the next 5 the wrist view. "
    "Is the robot making progress on the task? Answer positive, negative or unclear."
)
HISTORY_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 16, "seed": 0, "skip_special_tokens": True}
SHAPES = ("seed", "history")


def frame(seed: int, index: int, size: int = 256) -> np.ndarray:
    """A synthetic camera frame: a smooth scene with a block that moves over the episode; every
    (seed, index) pair gives different pixels, and JPEG sizes stay like real frames'."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = rng.integers(40, 160, size=3)
    img = np.empty((size, size, 3), np.uint8)
    for c in range(3):
        img[..., c] = np.clip(base[c] + (x + y * (c + 1)) * 40 // size, 0, 255)
    block = max(2, size // 6)
    top = int(rng.integers(0, size - block))
    left = (index * max(1, size // 11) + int(rng.integers(0, size))) % (size - block)
    img[top : top + block, left : left + block] = rng.integers(0, 255, size=3)
    return img


def jpeg_data_url(img: np.ndarray, quality: int) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img, mode="RGB").save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def seed_payload(model: str, frames: list[np.ndarray], task: str = TASK) -> dict:
    """Exactly what the seed's reward worker posts for one rollout (its frames already picked)."""
    content = [{"type": "image_url", "image_url": {"url": jpeg_data_url(f, 70)}} for f in frames]
    content.append({"type": "text", "text": SEED_PROMPT.format(task=task)})
    return {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0.0, "max_tokens": 16}


def history_payload(model: str, views: list[list[np.ndarray]], sampling: dict | None = None, task: str = TASK) -> dict:
    """What RLinf's API reward worker posts for one sample: every frame of every view, then the
    prompt, with `reward.api.sampling_params` spread into the body."""
    content = [{"type": "image_url", "image_url": {"url": jpeg_data_url(f, 95)}} for view in views for f in view]
    content.append({"type": "text", "text": HISTORY_PROMPT.format(task=task)})
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    body.update(HISTORY_SAMPLING if sampling is None else sampling)
    return body


_SCORE = re.compile(r"\[\[\s*([-+]?\d+(?:\.\d+)?)\s*\]\]")


def seed_score(text: str) -> float:
    """The seed's parse: the number inside [[...]], else success / fail words, else 0.0."""
    match = _SCORE.search(text)
    if match:
        return float(match.group(1))
    lowered = text.lower()
    if "success" in lowered:
        return 1.0
    if "fail" in lowered:
        return -1.0
    return 0.0


def payloads(shape: str, n: int, model: str, size: int = 256, offset: int = 0) -> list[dict]:
    if shape == "seed":
        return [seed_payload(model, [frame(offset + i, t, size) for t in range(8)]) for i in range(n)]
    if shape == "history":
        return [
            history_payload(model, [[frame(2 * (offset + i) + v, t, size) for t in range(5)] for v in range(2)])
            for i in range(n)
        ]
    raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


@dataclass
class Result:
    url: str
    shape: str
    n: int
    wall_s: float
    req_per_s: float
    p50_s: float
    p95_s: float
    max_s: float
    statuses: dict[str, int]
    prompt_tokens_mean: float | None = None
    completion_tokens_mean: float | None = None
    errors: list[str] = field(default_factory=list)
    repeats_wall_s: list[float] = field(default_factory=list)  # every measured repeat (this is the median one)
    vs_first: float | None = None  # this URL's median wall time over the first URL's, same shape


def served_model(url: str, timeout: float = 30.0) -> str:
    r = httpx.get(f"{url}/v1/models", timeout=timeout)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


async def _fire(url: str, bodies: list[bytes], timeout: float) -> tuple[float, list[tuple[int, float, dict | None]]]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def one(body: bytes) -> tuple[int, float, dict | None]:
            started = time.perf_counter()
            try:
                r = await client.post(
                    f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
                )
            except httpx.HTTPError as exc:
                return -1, time.perf_counter() - started, {"error": f"{type(exc).__name__}: {exc}"}
            elapsed = time.perf_counter() - started
            try:
                return r.status_code, elapsed, r.json()
            except ValueError:
                return r.status_code, elapsed, None

        started = time.perf_counter()
        results = await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - started, results


def measure(url: str, shape: str, n: int, size: int = 256, timeout: float = 600.0, offset: int = 0) -> Result:
    """N concurrent requests of `shape` (built before the clock starts) to one server."""
    model = served_model(url)
    bodies = [json.dumps(p).encode() for p in payloads(shape, n, model, size, offset)]
    wall, results = asyncio.run(_fire(url, bodies, timeout))
    latencies = sorted(r[1] for r in results)
    statuses: dict[str, int] = {}
    prompt, completion, errors = [], [], []
    for status, _, body in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status == 200 and body:
            prompt.append(body["usage"]["prompt_tokens"])
            completion.append(body["usage"]["completion_tokens"])
        elif len(errors) < 3:
            errors.append(json.dumps(body)[:300])
    q = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) > 1 else latencies * 19
    return Result(
        url=url,
        shape=shape,
        n=n,
        wall_s=round(wall, 3),
        req_per_s=round(n / wall, 2),
        p50_s=round(statistics.median(latencies), 3),
        p95_s=round(q[18], 3),
        max_s=round(latencies[-1], 3),
        statuses=statuses,
        prompt_tokens_mean=round(statistics.mean(prompt), 1) if prompt else None,
        completion_tokens_mean=round(statistics.mean(completion), 1) if completion else None,
        errors=errors,
    )


MIN_REPEATS = 3
# frame offsets (frame(seed, ...) seeds) far apart: warm-up passes and repeats never share a frame
WARMUP_OFFSET = 10**7
REPEAT_STRIDE = 10**5
SHAPE_STRIDE = 10**4


def compare(
    urls: list[str],
    shapes: list[str],
    ns: list[int],
    repeats: int,
    size: int,
    timeout: float,
    warmup: int = 1,
    warmup_n: int | None = None,
) -> list[dict]:
    """Warm every URL (`warmup` passes of every shape, `warmup_n` requests each, default the
    shape's n), then `repeats` rounds in which the URLs take turns on each shape with frames never
    sent before; one row per (URL, shape): its median repeat."""
    for url in urls:
        for w in range(warmup):
            for k, (shape, n) in enumerate(zip(shapes, ns, strict=True)):
                offset = WARMUP_OFFSET + w * REPEAT_STRIDE + k * SHAPE_STRIDE
                measure(url, shape, min(n, warmup_n or n), size, timeout, offset=offset)
    runs: dict[tuple[int, str], list[Result]] = {}
    indices = list(range(len(urls)))
    for r in range(repeats):
        order = indices[r % len(urls) :] + indices[: r % len(urls)]  # who goes first changes every repeat
        for k, (shape, n) in enumerate(zip(shapes, ns, strict=True)):
            for i in order:
                result = measure(urls[i], shape, n, size, timeout, offset=(r + 1) * REPEAT_STRIDE + k * SHAPE_STRIDE)
                logger.info("%s %s n=%d repeat %d: %.2f s", urls[i], shape, n, r + 1, result.wall_s)
                runs.setdefault((i, shape), []).append(result)
    rows = []
    for shape in shapes:
        first = None
        for i in indices:
            done = sorted(runs[(i, shape)], key=lambda x: x.wall_s)
            median = done[(len(done) - 1) // 2]
            median.repeats_wall_s = [x.wall_s for x in runs[(i, shape)]]
            wall = statistics.median(median.repeats_wall_s)
            if first is None:
                first = wall
            else:
                median.vs_first = round(wall / first, 3)
            rows.append(asdict(median))
    return rows


def report(paths: list[str]) -> str:
    """One Markdown table of the results in these JSON files (one row per URL and shape), each
    row's median repeat; `first / this` is the first row's median wall time for the same shape over
    this row's (below 1: this row is slower than the first), so two servers measured in turn compare
    in one table."""
    rows = [
        "| server | shape | n | median wall s | repeats s | first / this | req/s | p50 s | p95 s | statuses "
        "| prompt tok | completion tok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    first: dict[str, float] = {}
    for path in paths:
        with open(path) as fh:
            for r in json.load(fh)["results"]:
                statuses = " ".join(f"{k}x{v}" for k, v in sorted(r["statuses"].items()))
                walls = r.get("repeats_wall_s") or [r["wall_s"]]
                wall = statistics.median(walls)
                base = first.setdefault(r["shape"], wall)
                rows.append(
                    f"| {r['url']} | {r['shape']} | {r['n']} | {wall:.3f} | {', '.join(str(w) for w in walls)} "
                    f"| {base / wall:.3f} | {r['n'] / wall:.1f} | {r['p50_s']} | {r['p95_s']} | {statuses} "
                    f"| {r['prompt_tokens_mean']} | {r['completion_tokens_mean']} |"
                )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.bench_chat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", action="append", help="a server's base URL (repeat to compare)")
    parser.add_argument("--report", nargs="+", metavar="JSON", help="print one table of earlier --out files, and stop")
    parser.add_argument("--shape", action="append", choices=SHAPES, help="request shape (repeat, each with its --n)")
    parser.add_argument("--n", action="append", type=int, help="concurrent requests for the matching --shape")
    parser.add_argument("--size", type=int, default=256, help="frame side in pixels")
    parser.add_argument(
        "--warmup", type=int, default=1, help="unmeasured passes of every shape per URL before measuring (own frames)"
    )
    parser.add_argument("--warmup-n", type=int, help="requests per shape in a warm-up pass (default: the shape's --n)")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"measured repeats (>= {MIN_REPEATS})")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", help="also write the results here (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.report:
        print(report(args.report))
        return 0
    if not args.url:
        parser.error("give --url (or --report)")
    shapes = args.shape or ["seed"]
    ns = args.n or [64] * len(shapes)
    if len(ns) != len(shapes):
        parser.error("give one --n per --shape")
    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats must be at least {MIN_REPEATS}: a comparison reports medians")
    urls = [u.rstrip("/") for u in args.url]
    results = compare(urls, shapes, ns, args.repeats, args.size, args.timeout, args.warmup, args.warmup_n)
    text = json.dumps({"results": results}, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
