"""torch.cat of one step's episodes into a new buffer, pinned or not, alone in a process: the copy
vLLM's engine core makes before the vision encoder runs (issue 40, round 4), for comparing with
the stall a GPU trace shows there.

    python3 scripts/gpu/concat_bench.py      # on a GPU machine (pinned memory needs CUDA)

16 episodes of Qwen2.5-VL patches (2592 x 1176 each), uint8 then float32, 4 repeats each: the
first repeats allocate buffers of a size not yet cached by PyTorch's pinned-memory allocator.
"""

from __future__ import annotations

import time

import torch

EPISODES, PATCHES, WIDTH, REPEATS = 16, 2592, 1176, 4


def main() -> None:
    for dtype in (torch.uint8, torch.float32):
        items = [torch.randint(0, 255, (PATCHES, WIDTH)).to(dtype) for _ in range(EPISODES)]
        for pin in (False, True):
            times = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                out = torch.empty((EPISODES * PATCHES, WIDTH), dtype=dtype, pin_memory=pin)
                torch.cat(items, 0, out=out)
                times.append((time.perf_counter() - started) * 1000)
            mb = out.numel() * out.element_size() / 1e6
            print(dtype, "pinned" if pin else "pageable", f"{mb:.0f} MB", " ".join(f"{t:.1f}" for t in times), "ms")
    print(torch.get_num_threads())


if __name__ == "__main__":
    main()
