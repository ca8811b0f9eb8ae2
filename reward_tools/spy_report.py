"""Where a server's threads spent a profile: py-spy's collapsed stacks summed per thread.

    py-spy record --pid PID --subprocesses --threads --format raw -o spy.txt   (scripts/gpu/profile_gpu.sh, SPY=1)
    python -m reward_tools.spy_report spy.txt [--top 6] [--thread MainThread --inclusive 30]

Threads of one pool are counted together (`vllm-inputs_3` -> `vllm-inputs_N`); the engine core, a
process of its own, is one row. For each, the samples (at py-spy's rate: 250 a second in
profile_gpu.sh) and the functions most often at the top of the stack. `--thread NAME --inclusive K`
lists the K functions most often anywhere on that thread's stacks (what the event loop's time went
to). py-spy samples threads that are running, not waiting, so a row's samples are its busy time.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path


def _open(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def thread_name(frame: str) -> str:
    """`thread (1330): vllm-inputs_5` -> `vllm-inputs_N`; `process 1029:"VLLM::EngineCore"` stays."""
    if frame.startswith("process "):
        return frame.split(":", 1)[1].strip('"')
    name = re.sub(r"^thread \(\d+\):?\s*", "", frame).strip()
    return re.sub(r"_\d+$", "_N", name) or frame


def read(path: Path) -> list[tuple[str, list[str], int]]:
    """(thread, frames from the root, samples) per line of a `--format raw --threads` file. A line
    is `process;[subprocess;]thread;frames... count`; a subprocess's threads are named after it
    (`VLLM::EngineCore/Thread-2 (process_input_sockets)`)."""
    rows = []
    with _open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack:
                continue
            parts = stack.split(";")
            processes = [p for p in parts[:2] if p.startswith("process ")]
            rest = parts[len(processes) :]
            thread = thread_name(rest[0]) if rest and rest[0].startswith("thread ") else "?"
            frames = rest[1:] if thread != "?" else rest
            if len(processes) > 1:  # a child of the profiled process
                thread = f"{thread_name(processes[1])}/{thread}"
            rows.append((thread, frames, int(count)))
    return rows


def summary(rows, top: int) -> str:
    per_thread: collections.Counter = collections.Counter()
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, frames, n in rows:
        per_thread[name] += n
        leaves[name][frames[-1] if frames else "(no Python frame)"] += n
    lines = ["| thread | samples | top of stack (samples) |", "|---|---|---|"]
    for name, n in per_thread.most_common():
        tops = "; ".join(f"{leaf} ({c})" for leaf, c in leaves[name].most_common(top))
        lines.append(f"| {name} | {n} | {tops} |")
    return "\n".join(lines)


def inclusive(rows, thread: str, top: int) -> str:
    counts: collections.Counter = collections.Counter()
    for name, frames, n in rows:
        if name == thread:
            for frame in set(frames):
                counts[frame] += n
    return "\n".join(f"{n:6d}  {frame}" for frame, n in counts.most_common(top))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="py-spy's raw output (.txt or .txt.gz)")
    parser.add_argument("--top", type=int, default=6, help="functions per thread")
    parser.add_argument("--thread", help="also list where this thread's samples were, anywhere on its stacks")
    parser.add_argument("--inclusive", type=int, default=30, help="how many of those")
    args = parser.parse_args(argv)
    rows = read(args.path)
    print(summary(rows, args.top))
    if args.thread:
        print(f"\n{args.thread}, anywhere on the stack:")
        print(inclusive(rows, args.thread, args.inclusive))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
