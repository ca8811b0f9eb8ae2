"""Where the GPU's time went in a torch-profiler trace of vLLM's engine: how long the GPU was busy
inside the traced window, how much of that the vision encoder took, and the idle gaps between.

    python -m reward_tools.gpu_trace TRACE_OR_DIR [--json OUT]

The trace is the Chrome-trace file vLLM's torch profiler writes (`profiler_config={"profiler":
"torch", ...}`, `reward_tools.bench_raw --profile-dir DIR`); a directory means every trace in it
that holds GPU work. The hook path's floor is the GPU's own busy time: what the engine's steps
need however fast the front end is (issue 40).

Kernels are attributed to the vision encoder when the CPU call that launched them (matched by the
profiler's correlation id) ran inside vLLM's model-runner method `_execute_mm_encoder`. Each of the
largest gaps is named by what the thread that launched the next GPU work was doing in its middle:
the innermost Python function spanning it (vLLM's traces record Python calls with their stacks),
and the CUDA runtime call it was blocked in, if any. The CUDA runtime calls that took longest in
all (by name: a pinned-memory allocation, a synchronization) are listed too: a call that blocks
the launching thread holds back every kernel after it.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import logging
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("reward_tools.gpu_trace")

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver"}
ENCODER_FUNCTION = "_execute_mm_encoder"
GAP_MS = 1.0  # idle stretches shorter than this are launch latency, not waiting
TIMELINE_MS = 100  # the idle timeline's slice


@dataclass
class TraceReport:
    files: list[str]
    window_ms: float  # first GPU event's start to the last one's end
    busy_ms: float  # the union of GPU events in the window
    kernel_ms: float  # the sum of kernel durations (overlapping streams counted twice)
    encoder_kernel_ms: float  # kernels launched from inside the vision encoder's call
    encoder_cpu_ms: float  # the CPU time spent in the encoder's calls
    encoder_calls: int
    memcpy_ms: float
    idle_ms: float  # window - busy
    gaps: int  # idle stretches of at least GAP_MS
    gaps_ms: float
    largest_gaps_ms: list[float] = field(default_factory=list)
    # the largest gaps with the launching thread's innermost Python function at their middle
    gap_causes: list[dict[str, Any]] = field(default_factory=list)
    top_kernels: list[dict[str, Any]] = field(default_factory=list)
    top_encoder_kernels: list[dict[str, Any]] = field(default_factory=list)
    # CUDA runtime calls by name, longest in total first: ms, count, the longest one's ms
    runtime_calls: list[dict[str, Any]] = field(default_factory=list)
    # every idle stretch (short ones too: a GPU waiting on kernel launches) summed by its cause
    idle_by_cause: list[dict[str, Any]] = field(default_factory=list)
    idle_timeline_ms: list[float] = field(default_factory=list)  # idle per TIMELINE_MS of the window

    @property
    def busy_share(self) -> float:
        return self.busy_ms / self.window_ms if self.window_ms else 0.0


def load_events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(
        p for p in path.rglob("*") if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
    )
    if not files:
        raise SystemExit(f"gpu_trace: no trace (*.json, *.json.gz) under {path}")
    return files


def _union_ms(spans: list[tuple[float, float]]) -> tuple[float, list[tuple[float, float]]]:
    """The covered length in ms of (start, end) spans given in microseconds, and the gaps between
    them as (start, end) in microseconds."""
    covered, gaps = 0.0, []
    current_start = current_end = None
    for start, end in sorted(spans):
        if current_end is None or start > current_end:
            if current_end is not None:
                covered += current_end - current_start
                gaps.append((current_end, start))
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        covered += current_end - current_start
    return covered / 1000, gaps


Events = list[dict[str, Any]]


class _Calls:
    """Python calls (or CUDA runtime calls) per (pid, tid), for asking which spanned a moment."""

    def __init__(self, look_back: int) -> None:
        self.look_back = look_back  # how many earlier calls may still span a moment (1: calls never nest)
        self._calls: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
        self._starts: dict[tuple, list[float]] = {}

    def add(self, key: tuple, event: dict[str, Any]) -> None:
        self._calls[key].append((event["ts"], event["ts"] + event.get("dur", 0), event.get("name", "?")))

    def seal(self) -> None:
        for key, calls in self._calls.items():
            calls.sort()
            self._starts[key] = [start for start, _, _ in calls]

    def spanning(self, key: tuple, ts: float, enough: Callable[[list], bool] = lambda found: False) -> list:
        """The calls of that thread spanning `ts`, innermost (latest start) first, until `enough`."""
        calls, starts = self._calls.get(key, []), self._starts.get(key, [])
        found: list[tuple[float, float, str]] = []
        i = bisect.bisect_right(starts, ts) - 1
        for j in range(i, max(-1, i - self.look_back), -1):
            if calls[j][1] >= ts:
                found.append(calls[j])
                if enough(found):
                    break
        return found


# how many earlier calls of a thread are looked through for the ones spanning a moment: calls nest, so
# the outer ones started long before; a step's few thousand calls are enough to reach its own frame
_LOOK_BACK = 20000


def _gap_causes(events: Events, gpu: Events, launches: dict, gaps: list[tuple[float, float]], origin: float) -> Events:
    """For each gap, the innermost Python function of the thread that launched the GPU work right
    after it, at the gap's middle ("?" where the trace has no Python calls there), and the CUDA
    runtime call that thread was in then, if any."""
    starts = sorted((e["ts"], e.get("args", {}).get("correlation")) for e in gpu)
    functions, runtime = _Calls(_LOOK_BACK), _Calls(1)  # a thread's CUDA calls do not nest
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") == "python_function":
            functions.add((e.get("pid"), e.get("tid")), e)
        elif e.get("cat") in LAUNCH_CATEGORIES:
            runtime.add((e.get("pid"), e.get("tid")), e)
    functions.seal()
    runtime.seal()
    out = []
    for begin, end in gaps:
        middle = (begin + end) / 2
        i = bisect.bisect_left(starts, (end,))
        launch = launches.get(starts[i][1]) if i < len(starts) else None
        spanning = functions.spanning(launch[:2], middle, _has_frame) if launch else []
        blocked = runtime.spanning(launch[:2], middle, bool) if launch else []
        out.append(
            {
                "ms": round((end - begin) / 1000, 3),
                "at_ms": round((begin - origin) / 1000, 3),
                "cpu": _name(spanning),
                "runtime": blocked[0][2] if blocked else "",
            }
        )
    return out


def _has_frame(found: list[tuple[float, float, str]]) -> bool:
    return ".py(" in found[-1][2]


def _name(spanning: list[tuple[float, float, str]]) -> str:
    """The innermost Python frame of these nested calls, and the built-in it was in, if any."""
    if not spanning:
        return "?"
    inner = sorted(spanning, key=lambda f: f[1] - f[0])
    frame = next((name for _, _, name in inner if ".py(" in name), inner[0][2])
    builtin = inner[0][2].split(" at 0x")[0]
    return frame if builtin == frame else f"{frame} > {builtin}"


def _idle_by_cause(causes: Events, top: int) -> list[dict[str, Any]]:
    """All idle stretches summed by what the launching thread was in (its Python call and CUDA call)."""
    ms: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for c in causes:
        key = c["cpu"] + (f" [{c['runtime']}]" if c["runtime"] else "")
        ms[key] += c["ms"]
        count[key] += 1
    return [{"cpu": key, "ms": round(v, 3), "gaps": count[key]} for key, v in ms.most_common(top)]


def _idle_timeline(gaps: list[tuple[float, float]], origin: float, window_ms: float) -> list[float]:
    """Idle ms in each TIMELINE_MS slice of the window, from its start."""
    slices = [0.0] * (int(window_ms // TIMELINE_MS) + 1)
    for begin, end in gaps:
        t = begin
        while t < end:
            k = int((t - origin) / 1000 // TIMELINE_MS)
            edge = min(end, origin + (k + 1) * TIMELINE_MS * 1000)
            slices[min(k, len(slices) - 1)] += (edge - t) / 1000
            t = edge
    return [round(v, 1) for v in slices]


def _runtime_calls(events: Events, top: int) -> list[dict[str, Any]]:
    """CUDA runtime and driver calls by name, longest in total first."""
    total: Counter[str] = Counter()
    count: Counter[str] = Counter()
    longest: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES:
            name, ms = e.get("name", "?"), e.get("dur", 0) / 1000
            total[name] += ms
            count[name] += 1
            longest[name] = max(longest[name], ms)
    return [
        {"name": name, "ms": round(ms, 3), "count": count[name], "longest_ms": round(longest[name], 3)}
        for name, ms in total.most_common(top)
    ]


class _KernelTally:
    """Kernel time and launches per kernel name."""

    def __init__(self) -> None:
        self.ms: Counter[str] = Counter()
        self.count: Counter[str] = Counter()

    def add(self, kernel: dict[str, Any]) -> None:
        name = kernel.get("name", "?")
        self.ms[name] += kernel.get("dur", 0) / 1000
        self.count[name] += 1

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())

    def ranked(self, top: int) -> list[dict[str, Any]]:
        return [
            {"name": name[:100], "ms": round(ms, 3), "count": self.count[name]} for name, ms in self.ms.most_common(top)
        ]


def analyse(events: list[dict[str, Any]], files: list[str] | None = None, top: int = 8) -> TraceReport:
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        raise ValueError("the trace holds no GPU events (kernels, copies): was it taken on a GPU, while work ran?")
    launches = {
        e["args"]["correlation"]: (e.get("pid"), e.get("tid"), e["ts"])
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    encoder_spans: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    encoder = _Calls(1)  # the encoder's calls do not nest
    for e in events:
        if e.get("cat") == "python_function" and e.get("name", "").endswith(f": {ENCODER_FUNCTION}"):
            encoder_spans[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0)))
            encoder.add((e.get("pid"), e.get("tid")), e)
    encoder.seal()

    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in gpu]
    busy_ms, gaps = _union_ms(spans)
    origin = min(start for start, _ in spans)
    window_ms = (max(end for _, end in spans) - origin) / 1000
    memcpy_ms = sum(e.get("dur", 0) for e in gpu if e["cat"] != "kernel") / 1000
    every, encoder_only = _KernelTally(), _KernelTally()
    for e in gpu:
        if e["cat"] != "kernel":
            continue
        every.add(e)
        launch = launches.get(e.get("args", {}).get("correlation"))
        if launch is not None and encoder.spanning(launch[:2], launch[2], bool):
            encoder_only.add(e)
    every_gap = _gap_causes(events, gpu, launches, gaps, origin)  # at_ms: from the window's start
    # the gaps of at least GAP_MS with their causes, longest first
    long = sorted(
        ((g, c) for g, c in zip(gaps, every_gap, strict=True) if (g[1] - g[0]) / 1000 >= GAP_MS),
        key=lambda p: p[0][0] - p[0][1],
    )
    long_gaps = [g for g, _ in long]
    causes = [c for _, c in long[:5]]

    return TraceReport(
        files=files or [],
        window_ms=round(window_ms, 3),
        busy_ms=round(busy_ms, 3),
        kernel_ms=round(every.total_ms, 3),
        encoder_kernel_ms=round(encoder_only.total_ms, 3),
        encoder_cpu_ms=round(sum(e - s for v in encoder_spans.values() for s, e in v) / 1000, 3),
        encoder_calls=sum(len(v) for v in encoder_spans.values()),
        memcpy_ms=round(memcpy_ms, 3),
        idle_ms=round(window_ms - busy_ms, 3),
        gaps=len(long_gaps),
        gaps_ms=round(sum(e - b for b, e in long_gaps) / 1000, 3),
        largest_gaps_ms=[cause["ms"] for cause in causes],
        gap_causes=causes,
        top_kernels=every.ranked(top),
        top_encoder_kernels=encoder_only.ranked(top),
        runtime_calls=_runtime_calls(events, top),
        idle_by_cause=_idle_by_cause(every_gap, top),
        idle_timeline_ms=_idle_timeline(gaps, origin, window_ms),
    )


def render(report: TraceReport) -> str:
    lines = [
        f"GPU window {report.window_ms:.1f} ms, busy {report.busy_ms:.1f} ms ({100 * report.busy_share:.0f}%), "
        f"idle {report.idle_ms:.1f} ms ({report.gaps} gaps >= {GAP_MS:g} ms: {report.gaps_ms:.1f} ms; "
        f"largest {', '.join(f'{g:.1f}' for g in report.largest_gaps_ms) or '-'})",
        f"kernels {report.kernel_ms:.1f} ms, of which the vision encoder {report.encoder_kernel_ms:.1f} ms "
        f"({report.encoder_calls} calls, {report.encoder_cpu_ms:.1f} ms of CPU in them); "
        f"copies {report.memcpy_ms:.1f} ms",
    ]
    if report.gap_causes:
        lines += ["", "| largest gaps | ms | at ms | the launching thread's innermost Python call | in CUDA call |"]
        lines += ["|---|---|---|---|---|"]
        for n, c in enumerate(report.gap_causes, 1):
            blocked = f"`{c['runtime']}`" if c.get("runtime") else "-"
            lines.append(f"| {n} | {c['ms']:.1f} | {c['at_ms']:.1f} | `{c['cpu']}` | {blocked} |")
    for title, kernels in (("all kernels", report.top_kernels), ("the vision encoder's", report.top_encoder_kernels)):
        lines += ["", f"| {title} | ms | count |", "|---|---|---|"]
        lines += [f"| `{k['name']}` | {k['ms']:.1f} | {k['count']} |" for k in kernels]
    if report.idle_by_cause:
        lines += ["", "| all idle, by what the launching thread was in | ms | gaps |", "|---|---|---|"]
        lines += [f"| `{c['cpu']}` | {c['ms']:.1f} | {c['gaps']} |" for c in report.idle_by_cause]
    if report.idle_timeline_ms:
        timeline = " ".join(f"{v:g}" for v in report.idle_timeline_ms)
        lines += ["", f"idle ms per {TIMELINE_MS} ms of the window: {timeline}"]
    if report.runtime_calls:
        lines += ["", "| CUDA runtime calls | ms | count | longest ms |", "|---|---|---|---|"]
        lines += [
            f"| `{c['name']}` | {c['ms']:.1f} | {c['count']} | {c['longest_ms']:.1f} |" for c in report.runtime_calls
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.gpu_trace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", type=Path, help="a trace file, or a directory of them")
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    events: list[dict[str, Any]] = []
    used = []
    for path in trace_files(args.trace):
        loaded = load_events(path)
        if any(e.get("cat") in GPU_CATEGORIES for e in loaded):
            events += loaded
            used.append(path.name)
        else:
            logger.info("%s holds no GPU work (the front end's trace): skipped", path.name)
    try:
        report = analyse(events, used)
    except ValueError as exc:
        raise SystemExit(f"gpu_trace: {exc}") from None
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
