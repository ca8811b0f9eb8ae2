"""Score fidelity of a lossy setting: the same episodes scored by two servers, compared.

    python -m reward_tools.fidelity compare http://127.0.0.1:18080 http://127.0.0.1:18081 --n 64
    python -m reward_tools.fidelity scores --url http://127.0.0.1:18080 --out bf16.json   # one at a time,
    python -m reward_tools.fidelity scores --url http://127.0.0.1:18080 --out fp8.json    # e.g. on one GPU
    python -m reward_tools.fidelity compare bf16.json fp8.json

FP8 weights or an FP8 KV cache make scoring faster and change the scores a little; what matters
for training is whether the judge still ranks episodes the same way. Both sides score the same
episodes (deterministic: LIBERO-sized episodes of the benchmark, `reward_tools.bench.episode`,
seeds 0..N-1, the benchmark's task texts) on the hook's path, in `logprob` mode by default.
Prints JSON: Spearman rank correlation of the scores, the largest and mean absolute difference,
and how many episodes each side could not score. A side is a server URL (scored now) or a file
written by `scores`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import httpx
import numpy as np

from reward_client.client import RetryPolicy, RewardClient, RewardClientError
from reward_protocol.score import MAX_BATCH_ITEMS, BackendKwargs, ScoreOptions
from reward_tools.bench import TASKS, Episodes
from reward_tools.eval_metrics import spearman

logger = logging.getLogger("reward_tools.fidelity")

WORKLOAD_KEYS = ("n", "frames", "size", "score_mode", "gen_tokens")


def score_server(url: str, n: int, frames: int, size: int, score_mode: str, batch: int, gen_tokens: int = 0) -> dict:
    """The benchmark's first `n` episodes scored by the server at `url` (None where it gave no score).
    With `gen_tokens` K, each answer is exactly K new tokens, greedy, in the server's default score
    mode, and the answers' texts are kept too (`outputs`): a generating judge on random weights
    rarely gives a number, but two settings that compute the same give the same text."""
    health = httpx.get(f"{url.split(',')[0]}/health", timeout=30).json()
    episodes = Episodes(frames, size)
    scores: list[float | None] = []
    outputs: list[str | None] = []
    if gen_tokens:
        kwargs = BackendKwargs(max_tokens=gen_tokens, ignore_eos=True, temperature=0.0)
    else:
        kwargs = BackendKwargs(score_mode=score_mode)
    with RewardClient(url.split(","), RetryPolicy(deadline_s=3600, timeout_s=3600)) as client:
        while len(scores) < n:
            videos = episodes.take(min(batch, n - len(scores)))
            first = len(scores)
            items = client.score_episodes(
                [
                    (
                        ScoreOptions(
                            task_text=TASKS[(first + i) % len(TASKS)],
                            nframes=frames,
                            backend_kwargs=kwargs,
                        ),
                        v,
                    )
                    for i, v in enumerate(videos)
                ]
            )
            scores += [item.response.score if item.response is not None else None for item in items]
            outputs += [item.response.model_output if item.response is not None else None for item in items]
            logger.info("%s: %d of %d episodes scored", url, len(scores), n)
    return {
        "source": url,
        "server": {k: health.get(k) for k in ("backend", "engine", "model")},
        "n": n,
        "frames": frames,
        "size": size,
        "score_mode": score_mode,
        "gen_tokens": gen_tokens,
        "scores": scores,
        **({"outputs": outputs} if gen_tokens else {}),
    }


def compare_scores(a: list[float | None], b: list[float | None]) -> dict:
    """Rank correlation and absolute differences over the episodes both sides scored."""
    if len(a) != len(b):
        raise ValueError(f"the two sides scored different numbers of episodes ({len(a)} and {len(b)})")
    both = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    out: dict = {
        "episodes": len(a),
        "compared": len(both),
        "unscored_a": sum(x is None for x in a),
        "unscored_b": sum(y is None for y in b),
        "spearman": None,
        "max_abs_diff": None,
        "mean_abs_diff": None,
    }
    if both:
        x, y = (np.array(v, dtype=np.float64) for v in zip(*both, strict=True))
        diff = np.abs(x - y)
        out.update(
            spearman=spearman(x, y),
            max_abs_diff=float(diff.max()),
            mean_abs_diff=float(diff.mean()),
            mean_a=float(x.mean()),
            mean_b=float(y.mean()),
        )
    return out


def load_side(source: str, args: argparse.Namespace) -> dict:
    if source.startswith(("http://", "https://")):
        return score_server(source, args.n, args.frames, args.size, args.score_mode, args.batch, args.gen_tokens)
    side = json.loads(Path(source).read_text())
    if not isinstance(side, dict) or not isinstance(side.get("scores"), list):
        raise ValueError(f"{source}: not a scores file (write one with `python -m reward_tools.fidelity scores`)")
    return {**side, "file": source}


def compare_sides(a: dict, b: dict) -> dict:
    differs = {k: (a.get(k), b.get(k)) for k in WORKLOAD_KEYS if a.get(k) != b.get(k)}
    if differs:
        raise ValueError(f"the two sides scored different workloads: {differs}")
    same = {}
    if a.get("outputs") is not None and b.get("outputs") is not None:
        pairs = [(x, y) for x, y in zip(a["outputs"], b["outputs"], strict=True) if x is not None and y is not None]
        same = {"outputs_compared": len(pairs), "same_outputs": sum(x == y for x, y in pairs)}
    return {
        **same,
        "a": {"source": a.get("source"), "file": a.get("file"), **(a.get("server") or {})},
        "b": {"source": b.get("source"), "file": b.get("file"), **(b.get("server") or {})},
        "workload": {k: a.get(k) for k in WORKLOAD_KEYS},
        **compare_scores(a["scores"], b["scores"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.fidelity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    scores = sub.add_parser("scores", help="score the episodes on one server and write them to a file")
    scores.add_argument("--url", required=True)
    scores.add_argument("--out", required=True)
    compare = sub.add_parser("compare", help="compare two sides (server URLs or scores files); prints JSON")
    compare.add_argument("a")
    compare.add_argument("b")
    compare.add_argument("--out", help="also write the JSON here")
    for p in (scores, compare):
        p.add_argument("--n", type=int, default=64, help="episodes (default 64)")
        p.add_argument("--frames", type=int, default=16)
        p.add_argument("--size", type=int, default=256)
        p.add_argument("--score-mode", default="logprob")
        p.add_argument("--batch", type=int, default=64, help="episodes per request (the hook's batch)")
        p.add_argument("--gen-tokens", type=int, default=0, help="K: answers of exactly K greedy tokens, texts kept")
    args = parser.parse_args(argv)
    if not 1 <= args.batch <= MAX_BATCH_ITEMS:
        parser.error(f"--batch must be within 1..{MAX_BATCH_ITEMS}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        if args.command == "scores":
            side = score_server(args.url, args.n, args.frames, args.size, args.score_mode, args.batch, args.gen_tokens)
            Path(args.out).write_text(json.dumps(side, indent=2))
            print(json.dumps({k: v for k, v in side.items() if k not in ("scores", "outputs")}, indent=2))
            return 0
        report = compare_sides(load_side(args.a, args), load_side(args.b, args))
    except (ValueError, OSError, httpx.HTTPError, RewardClientError) as exc:
        parser.error(str(exc))
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
