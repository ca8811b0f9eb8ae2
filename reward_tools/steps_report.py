"""Where a benchmark batch spent its time, from the engine's own step log.

    python -m reward_tools.steps_report BENCH.json STEPS.jsonl [--decode-tokens 256] [--out report.json]
                                        [--timing TIMING.jsonl] [--feed]

BENCH.json is `reward_tools.bench`'s output (each row keeps its median batch's start and end,
`window`, on time.monotonic()), or `reward_tools.bench_curves`' (every repeat's window: one row
per repeat); STEPS.jsonl is the server's step log (`--engine-option
step_log=PATH`, vLLM: one line per engine step as its stat logger saw it, on the same clock).
Per row, the batch is cut into phases:

- `front_s`: the batch's start until the engine's first step (the client encoding and sending,
  the server receiving and decoding, the first episode's input processing);
- `prefill_s`: the first step until the step in which the last prompt got its first token
  (while episodes keep arriving and their prompts are computed, early ones already decode);
- `decode_s`: from there until the last step that produced a token (the remaining steps);
- `tail_s`: the last step until the client had every answer.

Also the number of steps in each phase and the median time between steps after the prefill
(`step_ms`: one decode step of the whole batch), and the server's per-episode engine stages
(means and largest: input processing, queue, prefill, decode). With a row of one new token (`gen1`,
the prefill alone) and a row of K tokens in the same file, `goal_s` is (gen1's wall + K x the
K row's step time) and `over_goal` the K row's wall against it, the measure issue 40 sets (<= 1.2).

`--timing` adds, per row, the worker's own timing of each step inside the row's batch (the file of
`--engine-option step_timing=PATH`, engines/vllm/step_timing.py): when each `execute_model` began
after the batch's start, its wall and CPU time, the vision encoder's share, the cycle collector's
pauses and what it scheduled, then a line that sums the batch (steps with work and empty ones,
what a working step held, the encoder's and the collector's totals) and the full collections in
the worker's process during it; for a curves file, every repeat's batch.

`--feed` adds, per batch, how many prompts the engine took in each second of it (their first
step, from the step log). While the engine's steps are short against a second, that is the rate
the server fed it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path


def _jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def load_steps(path: str) -> list[dict]:
    return sorted(_jsonl(path), key=lambda s: s["t"])


def phases(window: tuple[float, float], steps: list[dict]) -> dict:
    """The phases of one batch (see the module's doc) from the steps inside its window."""
    start, end = window
    inside = [s for s in steps if start <= s["t"] <= end]
    row: dict = {"wall_s": round(end - start, 4), "steps": len(inside)}
    if not inside:
        return row
    producing = [s for s in inside if s.get("new_tokens", 0) or s.get("finished", 0)]
    prefilled = [s for s in inside if s.get("prefilled", 0)]
    first = inside[0]["t"]
    prefill_end = prefilled[-1]["t"] if prefilled else first
    last = producing[-1]["t"] if producing else inside[-1]["t"]
    after = [s["t"] for s in inside if prefill_end <= s["t"] <= last]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    row.update(
        front_s=round(first - start, 4),
        prefill_s=round(prefill_end - first, 4),
        decode_s=round(last - prefill_end, 4),
        tail_s=round(end - last, 4),
        prefill_steps=sum(1 for s in inside if s["t"] <= prefill_end),
        decode_steps=len(gaps),
        step_ms=round(statistics.median(gaps) * 1000, 3) if gaps else None,
        max_waiting=max((s.get("waiting", 0) for s in inside), default=0),
        max_running=max((s.get("running", 0) for s in inside), default=0),
    )
    return row


def curve_rows(curves: dict, steps: list[dict]) -> list[dict]:
    """`reward_tools.bench_curves` output: one row per repeat (its own window), to show why
    repeats of one K differ."""
    rows = []
    for r in curves["rows"]:
        for i, window in enumerate(r.get("windows") or []):
            row = {"path": r["way"], "style": f"K={r['k']} #{i + 1}", "n": r["n"]}
            row.update(phases(tuple(window), steps))
            row["engine_mean_ms"] = row["engine_max_ms"] = {}
            rows.append(row)
    return rows


def feed(window: tuple[float, float], steps: list[dict]) -> list[int]:
    """Prompts the engine took (their first step) in each second of a batch, the last second partial."""
    start, end = window
    counts = [0] * max(1, math.ceil(end - start))
    for s in steps:
        if start <= s["t"] <= end:
            counts[min(int(s["t"] - start), len(counts) - 1)] += s.get("prefilled", 0)
    return counts


def _curves(bench: dict) -> bool:
    """Whether a benchmark file is `reward_tools.bench_curves`' (rows of repeats) rather than `reward_tools.bench`'s."""
    return "rows" in bench and "results" not in bench


def report(bench: dict, steps: list[dict], decode_tokens: int) -> list[dict]:
    if _curves(bench):
        return curve_rows(bench, steps)
    rows = []
    for r in bench["results"]:
        row = {"path": r["path"], "style": r["style"], "n": r["n"], "repeats_s": r.get("repeats_s")}
        row.update(phases(tuple(r.get("window") or (0.0, 0.0)), steps))
        row["wall_s"] = round(r["wall_s"], 4)
        row["engine_mean_ms"] = {k: round(v, 1) for k, v in (r.get("stages") or {}).items()}
        row["engine_max_ms"] = {k: round(v, 1) for k, v in (r.get("stages_max") or {}).items()}
        rows.append(row)
    prefill_only = {(r["path"], r["n"]): r for r in rows if r["style"] == "gen1"}
    for r in rows:
        base = prefill_only.get((r["path"], r["n"]))
        if base is not None and r["style"] == f"gen{decode_tokens}" and r.get("step_ms"):
            r["goal_s"] = round(base["wall_s"] + decode_tokens * r["step_ms"] / 1000, 4)
            r["over_goal"] = round(r["wall_s"] / r["goal_s"], 3)
    return rows


def _ms(stages: dict, key: str) -> str:
    return f"{stages[key]:.0f}" if key in stages else "-"


def _num(row: dict, key: str, fmt: str = ".2f") -> str:
    return format(row[key], fmt) if row.get(key) is not None else "-"


def table(rows: list[dict]) -> str:
    head = (
        "| path | style | N | wall s | front s | prefill s | decode s | tail s | steps (prefill/decode) "
        "| step ms | input ms mean/max | queue ms | prefill ms | decode ms | goal s | / goal |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        mean, top = r["engine_mean_ms"], r["engine_max_ms"]
        lines.append(
            f"| {r['path']} | {r['style']} | {r['n']} | {r['wall_s']:.2f} | {_num(r, 'front_s')} "
            f"| {_num(r, 'prefill_s')} | {_num(r, 'decode_s')} | {_num(r, 'tail_s')} "
            f"| {r.get('prefill_steps', '-')}/{r.get('decode_steps', '-')} | {_num(r, 'step_ms', '.1f')} "
            f"| {_ms(mean, 'input_ms')}/{_ms(top, 'input_ms')} | {_ms(mean, 'queue_ms')} | {_ms(mean, 'prefill_ms')} "
            f"| {_ms(mean, 'decode_ms')} | {_num(r, 'goal_s')} | {_num(r, 'over_goal', '.3f')} |"
        )
    return "\n".join(lines)


def timed_steps(window: tuple[float, float], timing: list[dict], what: str = "execute") -> list[dict]:
    """The worker's timed rows of one kind (`execute`: its steps; `gc`: the full collections in its
    process) that began inside a batch's window, times relative to its start."""
    start, end = window
    rows = []
    for r in timing:
        if r.get("what") == what and start <= r["t0"] <= end:
            rows.append({**r, "t0": round(r["t0"] - start, 4), "wall_ms": round((r["t1"] - r["t0"]) * 1000, 1)})
    return rows


def timing_table(name: str, rows: list[dict]) -> str:
    lines = [
        f"{name}: the worker's steps (execute_model)",
        "",
        "| began s | wall ms | CPU ms | encoder ms (calls) | GC ms (full) | tokens | requests (new) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        encoder = f"{r.get('encoder_ms', 0):.1f} ({r.get('encoder_calls', 0)})"
        collector = f"{r.get('gc_ms', 0):.1f} ({r.get('gc_full', 0)})" if "gc_ms" in r else "-"
        requests = f"{r.get('requests', 0)} ({r.get('new_requests', 0)})"
        times = f"{r['t0']:.3f} | {r['wall_ms']:.1f} | {r['cpu_ms']:.1f}"
        lines.append(f"| {times} | {encoder} | {collector} | {r.get('tokens', 0)} | {requests} |")
    return "\n".join(lines)


def timing_summary(rows: list[dict]) -> str:
    """One batch's timed steps in a line: how many did work and how many found nothing to do
    (the engine waited for inputs), what a working step held (medians), and the vision encoder's
    and the collector's totals."""
    work = [r for r in rows if r.get("tokens", 0) > 0]
    if not work:
        return f"steps with work: 0 of {len(rows)}"
    requests = statistics.median(r.get("requests", 0) for r in work)
    tokens = statistics.median(r.get("tokens", 0) for r in work)
    encoder = sum(r.get("encoder_ms", 0) for r in rows) / 1000
    collector = sum(r.get("gc_ms", 0) for r in rows)
    return (
        f"steps with work: {len(work)}, empty: {len(rows) - len(work)}; per working step (median) "
        f"{requests:g} requests, {tokens:g} tokens; encoder {encoder:.2f} s, collector {collector:.0f} ms in all"
    )


def batches(bench: dict) -> list[tuple[str, tuple[float, float]]]:
    """(name, window) of every batch a benchmark file measured: `reward_tools.bench`'s median batch
    per row, or every repeat of `reward_tools.bench_curves`' rows."""
    if _curves(bench):
        return [
            (f"curve K={r['k']} #{i + 1} N={r['n']} ({w[1] - w[0]:.2f} s)", (w[0], w[1]))
            for r in bench["rows"]
            for i, w in enumerate(r.get("windows") or [])
        ]
    return [
        (f"{r['path']} {r['style']} N={r['n']} ({r['wall_s']:.2f} s)", tuple(r.get("window") or (0.0, 0.0)))
        for r in bench.get("results", [])
    ]


def collections_line(rows: list[dict]) -> str:
    """The worker process's full collections inside a batch: when each began and what it took."""
    if not rows:
        return "full collections in the worker's process: none"
    each = ", ".join(f"{r['t0']:.3f} s ({r['wall_ms']:.1f} ms)" for r in rows)
    return f"full collections in the worker's process: {len(rows)}, {sum(r['wall_ms'] for r in rows):.1f} ms: {each}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.steps_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("bench", help="reward_tools.bench JSON")
    parser.add_argument("steps", help="the server's step log (--engine-option step_log=PATH)")
    parser.add_argument("--decode-tokens", type=int, default=256, help="K of the goal (gen1 + K decode steps)")
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--timing", help="the worker's step timing (--engine-option step_timing=PATH)")
    parser.add_argument("--feed", action="store_true", help="the prompts the engine took in each second of each batch")
    args = parser.parse_args(argv)
    bench = json.loads(Path(args.bench).read_text())
    steps = load_steps(args.steps)
    rows = report(bench, steps, args.decode_tokens)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    print(table(rows))
    if args.feed:
        print("\nprompts the engine took in each second of the batch:")
        for name, window in batches(bench):
            print(f"- {name}: {' '.join(str(n) for n in feed(window, steps))}")
    if args.timing:
        timing = _jsonl(args.timing)
        for name, window in batches(bench):
            worked = timed_steps(window, timing)
            print("\n" + timing_table(name, worked))
            print("\n" + timing_summary(worked))
            print(collections_line(timed_steps(window, timing, "gc")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
