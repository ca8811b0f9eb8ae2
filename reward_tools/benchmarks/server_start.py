"""How long a vLLM server takes from its command to `/health` ok, for each of several settings in
turn (round-robin, so a machine that slows down during the run slows every setting alike).

    python -m reward_tools.benchmarks.server_start --model-path CKPT --rounds 3 \\
        --setting "in core=--engine-option worker_in_core=true" \\
        --setting "vLLM's layout=--engine-option worker_in_core=false"

Each server starts on the CPU test preset (configs/server/cpu_tiny.yaml) unless `--config` says
otherwise, answers one /health ok and is stopped. Prints one line a start, then each setting's
median; `--concurrent 2` starts two servers of the same setting at once (as two test workers do).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import statistics
import tempfile
import time
from pathlib import Path

from reward_tools.launch import ServerProcess

PRESET = Path(__file__).resolve().parents[2] / "configs" / "server" / "cpu_tiny.yaml"


def one_start(flags: list[str], log_dir: Path) -> float:
    server = ServerProcess(flags, log_path=log_dir / f"server-{time.monotonic_ns()}.log")
    began = time.monotonic()
    try:
        server.start()
        server.wait_ready(600)
        return time.monotonic() - began
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--config", default=str(PRESET))
    parser.add_argument("--setting", action="append", required=True, help="NAME=FLAGS (the flags split on spaces)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=1, help="servers of one setting started at once")
    args = parser.parse_args(argv)
    settings = []
    for item in args.setting:
        name, sep, flags = item.partition("=")
        if not sep or not name:
            parser.error(f"--setting {item!r}: give NAME=FLAGS")
        settings.append((name, flags.split()))
    base = ["--config", args.config, "--model-path", args.model_path, "--engine", "vllm"]
    times: dict[str, list[float]] = {name: [] for name, _ in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, flags in settings:
                with cf.ThreadPoolExecutor(args.concurrent) as pool:
                    started = [pool.submit(one_start, [*base, *flags], Path(tmp)) for _ in range(args.concurrent)]
                    took = [f.result() for f in started]
                times[name] += took
                print(f"round {round_ + 1} {name}: " + ", ".join(f"{t:.1f} s" for t in took), flush=True)
    for name, took in times.items():
        print(f"{name}: median {statistics.median(took):.1f} s of {len(took)} ({min(took):.1f}-{max(took):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
