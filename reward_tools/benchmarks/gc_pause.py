"""How long one full garbage collection holds the interpreter in a server-like process, before and
after the start-up heap is frozen (reward_server.media.memory_release.freeze_startup_heap).

    python -m reward_tools.benchmarks.gc_pause [--repeats 3] [--out FILE.json]

Imports what the vLLM engine's process holds (vllm, torch, transformers, the checkpoint's processor
when the tiny one is built, the server), then times gc.collect() `--repeats` times on each side of
the freeze and prints JSON: objects tracked, and each side's pauses in ms.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time

from reward_server.media.memory_release import freeze_startup_heap


def _pauses_ms(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        out.append(round((time.perf_counter() - started) * 1000, 2))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch  # noqa: F401
    import transformers  # noqa: F401
    import vllm  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    import reward_server.cli  # noqa: F401
    from reward_server.bootstrap import tiny_checkpoint_dir
    from reward_server.engines.prompting import load_processor

    checkpoint = tiny_checkpoint_dir()
    processor = load_processor(str(checkpoint)) if (checkpoint / "config.json").exists() else None
    result = {
        "objects_tracked": len(gc.get_objects()),
        "processor_loaded": processor is not None,
        "before_freeze_ms": _pauses_ms(args.repeats),
    }
    result["frozen"] = freeze_startup_heap()
    result["after_freeze_ms"] = _pauses_ms(args.repeats)
    gc.unfreeze()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
