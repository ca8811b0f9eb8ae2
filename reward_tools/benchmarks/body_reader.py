"""What reading the hook's raw batch body costs the server's event loop (reward_server/http/body.py).

    python -m reward_tools.benchmarks.body_reader [--mib 192] [--episodes 64] [--repeats 5]

A body of the hook's size (64 episodes of 16 frames of 256x256: 192 MiB) arrives in uvicorn's
256 KiB chunks while one waiter per episode waits for its bytes, as `/score/batch` does. Two
arrivals: `burst` (every chunk at once: the reader's own cost) and `paced` (a chunk every 0.2 ms,
~1.2 GB/s: the kernel can fault in pages ahead of the bytes meanwhile). Prints, per arrival, the
median over repeats of the event loop thread's CPU time and the wall time until every waiter had
its bytes. Run it with another tree's reward_server first on PYTHONPATH (python -P) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from reward_server.http.body import BodyLimits, BodyReader

CHUNK = 256 * 1024
LIMITS = BodyLimits(max_bytes=1 << 31, idle_timeout_s=30, min_rate=1, total_s=300)


async def one_body(nbytes: int, episodes: int, pace_s: float) -> tuple[float, float]:
    chunk = bytes(CHUNK)
    count = nbytes // CHUNK
    sent = iter(range(count))

    async def receive() -> dict:
        i = next(sent, None)
        if i is None:
            await asyncio.Event().wait()  # the body is complete: only a disconnect could come
        if pace_s:
            await asyncio.sleep(pace_s)
        else:
            await asyncio.sleep(0)
        return {"type": "http.request", "body": chunk, "more_body": i < count - 1}

    reader = BodyReader(receive, count * CHUNK, LIMITS).start()
    each = count * CHUNK // episodes
    cpu, wall = time.thread_time(), time.perf_counter()
    await asyncio.gather(*(reader.wait_for((k + 1) * each) for k in range(episodes)))
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    await reader.close()
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=192)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import reward_server.http.body as body

    print(f"reader: {body.__file__}")
    for name, pace in (("burst", 0.0), ("paced", 0.0002)):
        runs = [asyncio.run(one_body(args.mib << 20, args.episodes, pace)) for _ in range(args.repeats)]
        cpu = statistics.median(r[0] for r in runs) * 1000
        wall = statistics.median(r[1] for r in runs) * 1000
        served = f"every waiter served after {wall:.1f} ms (median of {args.repeats})"
        print(f"{name}: event loop CPU {cpu:.1f} ms, {served}")


if __name__ == "__main__":
    main()
