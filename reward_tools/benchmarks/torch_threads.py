"""What a busy machine does to the engine core's pixel concatenation, by torch thread count
(reward_server/engines/vllm/threads.py).

    python -m reward_tools.benchmarks.torch_threads [--episodes 16] [--busy 0] [--repeats 20]

Before the vision encoder runs, vLLM's engine core concatenates a step's pixel patches on the CPU
(`torch.cat(..., out=...)`, uint8, 16 episodes of 2592 x 1176: 49 MB) while the GPU waits. This
times that copy with this process's torch threads (set them with OMP_NUM_THREADS), alone and
beside `--busy` threads that keep resizing frames in torch as the server's input threads do (each
with torch's pool of the same size). Prints JSON: the thread count, then the median and largest
copy time in ms, idle and busy. Run it once with OMP_NUM_THREADS=1 and once without to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch

PATCHES, PATCH_BYTES = 2592, 1176  # one 16-frame 252x252 episode's uint8 patches (Qwen2.5-VL)


def copy_times(sources: list[torch.Tensor], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        out = torch.empty((PATCHES * len(sources), PATCH_BYTES), dtype=torch.uint8)
        start = time.perf_counter()
        torch.cat(sources, out=out)
        times.append((time.perf_counter() - start) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--busy", type=int, default=2, help="threads resizing frames meanwhile")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sources = [torch.randint(0, 255, (PATCHES, PATCH_BYTES), dtype=torch.uint8) for _ in range(args.episodes)]
    result = {"torch_threads": torch.get_num_threads(), "episodes": args.episodes, "busy_threads": args.busy}
    result["idle"] = copy_times(sources, args.repeats)
    stop = threading.Event()

    def resize() -> None:
        frames = torch.rand(16, 3, 256, 256)
        while not stop.is_set():
            torch.nn.functional.interpolate(frames, size=(252, 252), mode="bilinear")

    workers = [threading.Thread(target=resize, daemon=True) for _ in range(args.busy)]
    for worker in workers:
        worker.start()
    time.sleep(0.5)
    result["busy"] = copy_times(sources, args.repeats)
    stop.set()
    for worker in workers:
        worker.join()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
