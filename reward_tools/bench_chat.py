"""OpenAI chat requests of the shapes RL reward workers send, concurrently, against one or more servers.

    python -m reward_tools.bench_chat --url http://127.0.0.1:18080 --url http://127.0.0.1:8000 \\
        --shape seed --n 64 --shape history --n 512 --out chat.json

Shapes (every request carries frames no other request carries, so no cache helps):
- `seed`: the seed's ManiSkill reward worker: one user turn of 8 JPEG frames (quality 70) as
  `data:image/jpeg;base64,` URLs, then the `[[SCORE]]` question; temperature 0, max_tokens 16.
- `history`: RLinf's API reward worker in `history_buffer` mode: one window of 5 frames from
  each of 2 views (JPEG quality 95), then the question, its sampling parameters spread into the
  body; one request per sample from a thread pool, so a whole batch of envs arrives at once.

The same payloads go to every URL (this server, plain `vllm serve`, SGLang): each URL's served
model name is read from `GET /v1/models`. Prints JSON: wall time, requests per second, latency
p50 / p95 / max, status counts, and the mean prompt and completion tokens from `usage`.
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


def report(paths: list[str]) -> str:
    """One Markdown table of the results in these JSON files (one row per URL and shape)."""
    rows = [
        "| server | shape | n | wall s | req/s | p50 s | p95 s | statuses | prompt tok | completion tok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        with open(path) as fh:
            for r in json.load(fh)["results"]:
                statuses = " ".join(f"{k}x{v}" for k, v in sorted(r["statuses"].items()))
                rows.append(
                    f"| {r['url']} | {r['shape']} | {r['n']} | {r['wall_s']} | {r['req_per_s']} | {r['p50_s']} "
                    f"| {r['p95_s']} | {statuses} | {r['prompt_tokens_mean']} | {r['completion_tokens_mean']} |"
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
    parser.add_argument("--warmup", type=int, default=2, help="requests sent to each URL before measuring")
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
    results = []
    for url in args.url:
        url = url.rstrip("/")
        if args.warmup:
            measure(url, shapes[0], args.warmup, args.size, args.timeout, offset=10**6)
        for k, (shape, n) in enumerate(zip(shapes, ns, strict=True)):
            result = measure(url, shape, n, args.size, args.timeout, offset=k * 10**4)
            logger.info("%s %s n=%d: %.2f s, %s", url, shape, n, result.wall_s, result.statuses)
            results.append(asdict(result))
    text = json.dumps({"results": results}, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
