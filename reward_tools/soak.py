"""Soak: the RLinf hook's real traffic against one server for a long time, with faults injected.

    python -m reward_tools.soak --launch "--config configs/server/cpu_tiny.yaml" --minutes 60 \\
        --out docs/bench/cpu_soak_1h.json

Env workers (threads, each with its own VLMRewardHook, half on the raw transport and half on
inline JSON) step batches of envs the way LiberoEnv calls the hook, episode after episode, under
the hook's default settings (fail_on_request_error: True). Meanwhile, on a schedule:

- restart: the server's whole process group (the API process, vLLM's engine core, the decode
  workers: what slurm's scancel and systemd's stop signal) gets SIGTERM, or SIGKILL on every
  second restart, and it is started again on the same port at --restart-at-min minutes; the
  workers must ride through it;
- cut: clients send a full request and close the connection before the answer;
- stall: clients declare large bodies (Content-Length, or chunked) and trickle a byte every 2 s;
- huge: a client names a long 720p video under the server's video root with many frames;
- bad: requests the server must refuse cleanly (4xx, never 5xx).

The server's resident memory (its process tree) is sampled every --sample-s seconds, with
/stats. Reported: episodes judged, fallbacks (and of them parse failures), exceptions that would
stop training, lost episodes (ended but neither scored nor counted as a fallback), latency p50/p99
of the scoring calls, status counts of the fault clients, 500s (answers and the server logs'
internal errors), and each server lifetime's memory growth (`lifetime_memory`). Writes the JSON and
a PNG of memory and latency over time (matplotlib).

Memory growth, the same figure for a lifetime of any length: the lifetime runs from ready to its
end; its first quarter is warm-up (caches and allocator pools fill, which is not growth), so
`growth_pct` = the median RSS over its last quarter / the median over its second quarter - 1, and
`slope_mib_per_h` the least-squares slope of RSS over its last three quarters. A lifetime with
fewer than 3 samples in either quarter reports None (too short to say).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import shlex
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

from reward_client.rlinf.config import RewardModelConfig
from reward_client.rlinf.hook import VLMRewardHook
from reward_protocol.score import InlineFrames
from reward_tools.launch import ServerProcess, free_port
from reward_tools.memory import tree_rss_bytes

logger = logging.getLogger("reward_tools.soak")


def rss_mib(pid: int) -> float:
    return tree_rss_bytes(pid) / 2**20


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)


class Supervisor:
    """The server under test: one port, restarted in place; every lifetime's log kept."""

    def __init__(self, flags: list[str], log_dir: Path, clock: Clock):
        self.flags, self.log_dir, self.clock = flags, log_dir, clock
        self.port = free_port()
        self.lifetimes: list[dict] = []
        self.server: ServerProcess | None = None
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        n = len(self.lifetimes)
        server = ServerProcess(self.flags, port=self.port, log_path=self.log_dir / f"server-{n}.log")
        server.start()
        life = {"index": n, "started_s": self.clock.now(), "ready_s": None, "ended_s": None, "how": None}
        with self.lock:
            self.server = server
            self.lifetimes.append(life)
        server.wait_ready(900)
        life["ready_s"] = self.clock.now()
        logger.info("server lifetime %d ready at %.0f s", n, life["ready_s"])

    def restart(self, kill: bool) -> None:
        with self.lock:
            server, life = self.server, self.lifetimes[-1]
        if kill:  # a crash: no drain, the engine's processes go with it
            try:
                os.killpg(server.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.proc.wait()
        server.stop(timeout=60)  # SIGTERM to the process group (a drain), then SIGKILL to what is left
        life["ended_s"], life["how"] = self.clock.now(), "SIGKILL to the group" if kill else "SIGTERM to the group"
        self.start()

    def pid(self) -> int | None:
        with self.lock:
            return self.server.proc.pid if self.server and self.server.proc else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(timeout=60)
            self.lifetimes[-1]["ended_s"] = self.clock.now()
            self.lifetimes[-1]["how"] = "end"

    def internal_errors(self) -> int:
        return sum(p.read_text(errors="replace").count("internal error") for p in self.log_dir.glob("server-*.log"))


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: collections.Counter = collections.Counter()
        self.events: list[dict] = []
        self.latency: list[tuple[float, float, int]] = []  # (t, seconds, episodes) per scoring call
        self.exceptions: list[str] = []
        self.ended = self.scored = self.fallbacks = self.request_errors = self.parse_failures = 0

    def event(self, clock: Clock, kind: str, **info) -> None:
        with self.lock:
            self.events.append({"t": clock.now(), "kind": kind, **info})

    def code(self, key) -> None:
        with self.lock:
            self.codes[str(key)] += 1


def env_worker(index: int, sup: Supervisor, tally: Tally, clock: Clock, stop: threading.Event, args) -> None:
    """One env worker: `envs` envs stepped together, episodes of random length, as LiberoEnv calls the hook."""
    rng = np.random.default_rng(index)
    transport = "raw" if index % 2 == 0 else "inline"
    n = args.envs
    config = RewardModelConfig(
        enable=True, url=sup.url, transport=transport, nframes=args.nframes, score_mode=args.score_mode or None
    )
    hook = VLMRewardHook(config, num_envs=n)
    tasks = [f"put the {w} in the basket" for w in ("bowl", "mug", "cup", "plate", "spoon", "book", "box", "can")]
    while not stop.is_set():
        steps = int(rng.integers(args.min_steps, args.max_steps + 1))
        success_at = [int(rng.integers(2, steps + 1)) if rng.random() < 0.4 else -1 for _ in range(n)]
        texts = [tasks[int(rng.integers(len(tasks)))] for _ in range(n)]
        base = rng.integers(0, 200, size=(n, 1, 1, 1))
        before = dict(hook.counts)
        ended, failed = 0, False
        try:
            hook.on_reset(None, np.broadcast_to(base, (n, args.size, args.size, 3)).astype(np.uint8))
            done = np.zeros(n, bool)
            for t in range(1, steps + 1):
                frames = (base + rng.integers(0, 40, size=(n, args.size, args.size, 3))).clip(0, 255).astype(np.uint8)
                term = np.array([s == t for s in success_at]) & ~done
                trunc = np.full(n, t == steps) & ~done & ~term
                new = int((term | trunc).sum())
                ended += new  # counted before the call: an episode lost to an exception is lost
                started = time.perf_counter()
                hook.on_step(frames, texts, term, trunc)
                if new:
                    with tally.lock:
                        tally.latency.append((clock.now(), time.perf_counter() - started, new))
                done |= term | trunc
        except Exception as exc:  # a training run would end here: counted, then the worker goes on
            failed = True
            tally.event(clock, "exception", worker=index, error=f"{type(exc).__name__}: {exc}"[:500])
            with tally.lock:
                tally.exceptions.append(f"{type(exc).__name__}: {exc}"[:500])
        with tally.lock:
            tally.ended += ended
            for key in ("scored", "fallbacks", "request_errors", "parse_failures"):
                setattr(tally, key, getattr(tally, key) + hook.counts[key] - before.get(key, 0))
        if failed:
            hook = VLMRewardHook(config, num_envs=n)  # what a restarted training run would build
        stop.wait(args.pause_s)


def _raw_request(url: str, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(head.encode() + b"\r\n" + body)
    return sock


def small_body(i: int, size: int = 64) -> dict:
    frames = np.full((8, size, size, 3), (i * 37) % 256, np.uint8)
    return {"task_text": f"soak probe {i}", "nframes": 8, "frames": InlineFrames.from_array(frames).model_dump()}


def fault_cut(sup: Supervisor, tally: Tally, clock: Clock, count: int) -> None:
    """Full requests whose client hangs up before the answer."""
    for i in range(count):
        body = json.dumps(small_body(i)).encode()
        try:
            sock = _raw_request(
                sup.url, "POST", "/score", {"content-type": "application/json", "content-length": str(len(body))}, body
            )
            time.sleep(0.05)
            sock.close()
            tally.code("cut_sent")
        except OSError as exc:
            tally.code(f"cut_connect_{type(exc).__name__}")
    tally.event(clock, "cut", count=count)


def fault_stall(sup: Supervisor, tally: Tally, clock: Clock, count: int, seconds: float, declared_mb: int) -> None:
    """Uploads that declare a large body (or send chunks) and then trickle a byte every 2 s."""
    tally.event(clock, "stall_start", count=count, seconds=seconds, declared_mb=declared_mb)
    socks = []
    for i in range(count):
        if i % 2 == 0:
            headers = {"content-type": "application/json", "content-length": str(declared_mb * 2**20)}
        else:
            headers = {"content-type": "application/json", "transfer-encoding": "chunked"}
        try:
            sock = _raw_request(sup.url, "POST", "/score/batch", headers, b"{" if i % 2 == 0 else b"1\r\n{\r\n")
            sock.setblocking(False)
            socks.append((sock, i % 2 == 1))
        except OSError:
            tally.code("stall_connect_failed")
    closed_after: list[float] = []
    answers: collections.Counter = collections.Counter()
    started = time.monotonic()
    live = list(socks)
    while live and time.monotonic() - started < seconds:
        time.sleep(2)
        for entry in list(live):
            sock, chunked = entry
            try:
                data = sock.recv(4096)
                if data or data == b"":
                    # an answer (408 expected) or a close: the server let go of this upload
                    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                    answers[status] += 1
                    closed_after.append(round(time.monotonic() - started, 1))
                    live.remove(entry)
                    sock.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                answers["reset"] += 1
                closed_after.append(round(time.monotonic() - started, 1))
                live.remove(entry)
                continue
            try:
                sock.send(b"1\r\n \r\n" if chunked else b" ")
            except OSError:
                pass
    for sock, _ in live:
        sock.close()
    for status, n in answers.items():
        tally.codes[f"stall_{status}"] += n
    tally.event(
        clock, "stall_end", still_open=len(live), closed_by_server=len(closed_after), closed_after_s=closed_after
    )


def fault_huge(sup: Supervisor, tally: Tally, clock: Clock, video: str) -> None:
    """Two items naming a long 720p video with the most frames and pixels the schema allows."""
    item = {"task_text": "soak huge video", "video_path": video, "nframes": 128, "max_pixels": 1280 * 28 * 28}
    rss_before = rss_mib(sup.pid() or 0)
    try:
        r = httpx.post(f"{sup.url}/score/batch", json={"requests": [item, item]}, timeout=600)
        status = r.status_code
        kinds = [i["error"]["type"] if i.get("error") else "ok" for i in r.json().get("results", [])]
    except httpx.HTTPError as exc:
        status, kinds = type(exc).__name__, []
    tally.code(f"huge_{status}")
    tally.event(clock, "huge", status=status, items=kinds, rss_before_mib=round(rss_before))


def fault_bad(sup: Supervisor, tally: Tally, clock: Clock) -> None:
    """Requests the server must refuse with a 4xx that says what was wrong."""
    frames = small_body(0)["frames"]
    bodies = [
        {"task_text": "t", "frames": frames, "backend_kwargs": {"bogus": 1}},
        {"task_text": "t", "video_path": "/nonexistent/episode.mp4"},
        {"task_text": "t", "frames": {"shape": [2, 8, 8, 3], "data_b64": "AAAA"}},
    ]
    for body in bodies:
        try:
            r = httpx.post(f"{sup.url}/score", json=body, timeout=60)
            tally.code(f"bad_{r.status_code}")
        except httpx.HTTPError as exc:
            tally.code(f"bad_{type(exc).__name__}")


def sampler(sup: Supervisor, samples: list, clock: Clock, stop: threading.Event, every_s: float) -> None:
    with httpx.Client(timeout=5) as http:
        while not stop.is_set():
            pid = sup.pid()
            row = {"t": clock.now(), "life": len(sup.lifetimes) - 1, "rss_mib": round(rss_mib(pid), 1) if pid else 0.0}
            try:
                stats = http.get(f"{sup.url}/stats").json()
                keep = ("decoded_mb", "inflight", "running", "mm_cache_bytes")
                row.update({k: v for k, v in stats.items() if k.startswith(keep)})
            except (httpx.HTTPError, ValueError):
                row["stats"] = None
            samples.append(row)
            stop.wait(every_s)


def faults(sup: Supervisor, tally: Tally, clock: Clock, stop: threading.Event, args, video: str) -> None:
    restarts = sorted(float(m) * 60 for m in args.restart_at_min.split(",") if m.strip())
    due = {"cut": args.cut_every_s, "stall": args.stall_every_s / 2, "huge": args.huge_every_s, "bad": 30.0}
    kills = 0
    while not stop.wait(1.0):
        now = clock.now()
        if restarts and now >= restarts[0]:
            restarts.pop(0)
            kill = kills % 2 == 1
            kills += 1
            tally.event(clock, "restart", how="SIGKILL" if kill else "SIGTERM")
            sup.restart(kill)
            tally.event(clock, "restarted")
            continue
        if now >= due["cut"]:
            fault_cut(sup, tally, clock, 4)
            due["cut"] = now + args.cut_every_s
        if now >= due["bad"]:
            fault_bad(sup, tally, clock)
            due["bad"] = now + 30.0
        if now >= due["huge"]:
            threading.Thread(target=fault_huge, args=(sup, tally, clock, video), daemon=True).start()
            due["huge"] = now + args.huge_every_s
        if now >= due["stall"]:
            threading.Thread(
                target=fault_stall,
                args=(sup, tally, clock, args.stall_count, args.stall_s, args.stall_declared_mb),
                daemon=True,
            ).start()
            due["stall"] = now + args.stall_every_s


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _slope_per_h(rows: list[dict]) -> float | None:
    """Least-squares slope of rss_mib over t, MiB per hour."""
    if len(rows) < 2:
        return None
    ts = np.array([r["t"] for r in rows], float)
    ys = np.array([r["rss_mib"] for r in rows], float)
    if np.ptp(ts) == 0:
        return None
    return float(np.polyfit(ts, ys, 1)[0] * 3600)


def lifetime_memory(samples: list[dict], lifetimes: list[dict], min_samples: int = 3) -> list[dict]:
    """Per server lifetime (ready to end): median RSS over its second quarter and over its last
    quarter, growth between them, the slope over its last three quarters (the module's doc)."""
    out = []
    for life in lifetimes:
        if life["ready_s"] is None:
            continue
        rows = [s for s in samples if s["life"] == life["index"] and s["rss_mib"] > 0 and s["t"] >= life["ready_s"]]
        if not rows:
            continue
        start = life["ready_s"]
        span = rows[-1]["t"] - start
        q = span / 4
        second = [s["rss_mib"] for s in rows if start + q <= s["t"] < start + 2 * q]
        last = [s["rss_mib"] for s in rows if s["t"] >= start + 3 * q]
        settled = [s for s in rows if s["t"] >= start + q]
        entry = {
            "index": life["index"],
            "minutes": round(span / 60, 1),
            "rss_mib_q2_median": round(statistics.median(second), 1) if second else None,
            "rss_mib_q4_median": round(statistics.median(last), 1) if last else None,
            "rss_mib_peak": round(max(s["rss_mib"] for s in rows), 1),
            "ended": life["how"],
            "growth_pct": None,
            "slope_mib_per_h": None,
        }
        if len(second) >= min_samples and len(last) >= min_samples:
            entry["growth_pct"] = round(100 * (entry["rss_mib_q4_median"] / entry["rss_mib_q2_median"] - 1), 2)
            slope = _slope_per_h(settled)
            entry["slope_mib_per_h"] = round(slope, 1) if slope is not None else None
        out.append(entry)
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, lat) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    samples = report["samples"]
    mem.plot([s["t"] / 60 for s in samples], [s["rss_mib"] for s in samples], lw=1, label="server RSS (process tree)")
    decoded = [(s["t"] / 60, s["decoded_mb_in_use"]) for s in samples if "decoded_mb_in_use" in s]
    if decoded:
        mem.plot(*zip(*decoded, strict=True), lw=1, label="decoded MB in use")
    colors = {"restart": "red", "stall_start": "orange", "huge": "purple"}
    for e in report["events"]:
        if e["kind"] in colors:
            for ax in (mem, lat):
                ax.axvline(e["t"] / 60, color=colors[e["kind"]], lw=0.6, alpha=0.5)
    mem.set_ylabel("MiB")
    mem.legend(loc="upper left", fontsize=8)
    mem.set_title("soak: memory (red: restart, orange: stalled uploads, purple: huge video)", fontsize=10)
    lat.scatter([t / 60 for t, _, _ in report["latency"]], [s for _, s, _ in report["latency"]], s=3)
    lat.set_yscale("log")
    lat.set_ylabel("scoring call latency (s)")
    lat.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SERIES = ("samples", "latency", "events")


def dump(report: dict) -> str:
    """The summary readable (indented), the time series one line each (they are thousands of rows)."""
    rows = [f"  {json.dumps(k)}: {json.dumps(v, indent=None if k in SERIES else 2)}" for k, v in report.items()]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def make_video(root: Path, frames: int, width: int, height: int) -> str:
    from reward_client.video_io import write_mp4

    # a moving gradient: cheap to encode, still a full-size frame to decode
    x = np.arange(width, dtype=np.uint16)[None, :] + np.arange(height, dtype=np.uint16)[:, None]
    clip = np.stack([np.repeat(((x + 8 * t) % 256).astype(np.uint8)[:, :, None], 3, axis=2) for t in range(frames)])
    return write_mp4(clip, root / "huge.mp4")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch", required=True, help="server flags (quoted); --video-root is added")
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--workers", type=int, default=2, help="env workers (hooks), half raw, half inline")
    parser.add_argument("--envs", type=int, default=4, help="envs per worker")
    parser.add_argument("--size", type=int, default=128, help="frame height and width")
    parser.add_argument("--nframes", type=int, default=8)
    parser.add_argument("--min-steps", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=24)
    parser.add_argument(
        "--score-mode",
        default="logprob",
        help="the hook's score_mode ('' for the server's): logprob always parses, even on random weights",
    )
    parser.add_argument("--pause-s", type=float, default=1.0, help="between a worker's episodes")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--restart-at-min", default="8,16", help="minutes at which the server restarts")
    parser.add_argument("--cut-every-s", type=float, default=60)
    parser.add_argument("--stall-every-s", type=float, default=300)
    parser.add_argument("--stall-count", type=int, default=8)
    parser.add_argument("--stall-s", type=float, default=60)
    parser.add_argument("--stall-declared-mb", type=int, default=64)
    parser.add_argument("--huge-every-s", type=float, default=300)
    parser.add_argument("--huge-frames", type=int, default=96)
    parser.add_argument("--note", default="", help="recorded in the JSON (e.g. what else ran on the machine)")
    parser.add_argument("--out", required=True, help="JSON path; the PNG goes beside it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("reward_client.rlinf.judging").setLevel(logging.WARNING)  # a line per batch otherwise

    clock = Clock()
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    video_root = work / "videos"
    video_root.mkdir()
    video = make_video(video_root, args.huge_frames, 1280, 720)
    sup = Supervisor([*shlex.split(args.launch), "--video-root", str(video_root)], work, clock)
    logger.info("server logs and video under %s", work)
    sup.start()
    tally, samples, stop = Tally(), [], threading.Event()
    threads = [
        threading.Thread(target=sampler, args=(sup, samples, clock, stop, args.sample_s), daemon=True),
        threading.Thread(target=faults, args=(sup, tally, clock, stop, args, video), daemon=True),
    ]
    threads += [
        threading.Thread(target=env_worker, args=(i, sup, tally, clock, stop, args), daemon=True)
        for i in range(args.workers)
    ]
    for t in threads:
        t.start()
    end = time.monotonic() + args.minutes * 60
    # SIGUSR1 ends the soak early and still writes the report (a lent machine's time running out)
    early = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: early.set())
    try:
        while time.monotonic() < end and not early.is_set():
            time.sleep(10)
            with tally.lock:
                lat = [s for _, s, _ in tally.latency]
            logger.info(
                "t=%.0f s: %d ended, %d scored, %d fallbacks, %d exceptions; rss %.0f MiB; p50 %s s",
                clock.now(), tally.ended, tally.scored, tally.fallbacks, len(tally.exceptions),
                samples[-1]["rss_mib"] if samples else 0, percentile(lat, 50),
            )  # fmt: skip
    finally:
        stop.set()
        for t in threads[2:]:
            t.join(900)  # workers finish their episode (and its scoring)
        threads[1].join(120)
        internal = sup.internal_errors()
        sup.stop()
    lat = [s for _, s, _ in tally.latency]
    memory = lifetime_memory(samples, sup.lifetimes)
    longest = max(memory, key=lambda m: m["minutes"]) if memory else None
    growth_rule = (
        "per lifetime (ready to end): median RSS of its last quarter / median of its second quarter - 1 "
        "(the first quarter is warm-up); slope: least squares over its last three quarters"
    )
    report = {
        "what": "reward_tools.soak: the RLinf hook's traffic with faults injected",
        "launch": args.launch,
        "args": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "machine": f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB; {args.note}",
        "minutes": round(clock.now() / 60, 1),
        "episodes_ended": tally.ended,
        "episodes_scored": tally.scored,
        "fallbacks": tally.fallbacks,
        "parse_failures": tally.parse_failures,
        "request_errors": tally.request_errors,
        "training_stopping_exceptions": len(tally.exceptions),
        "exceptions": tally.exceptions[:20],
        "lost_episodes": tally.ended - tally.scored - tally.fallbacks,
        "scoring_calls": len(lat),
        "latency_s": {"p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat, default=None)},
        "status_counts": dict(tally.codes),
        "http_500": sum(n for k, n in tally.codes.items() if k.endswith("_500")),
        "server_internal_errors_logged": internal,
        "memory_by_server_lifetime": memory,
        "memory_growth_rule": growth_rule,
        "memory_growth_pct_longest_lifetime": longest["growth_pct"] if longest else None,
        "memory_slope_mib_per_h_longest_lifetime": longest["slope_mib_per_h"] if longest else None,
        "lifetimes": sup.lifetimes,
        "events": tally.events,
        "samples": samples,
        "latency": [(t, round(s, 3), n) for t, s, n in tally.latency],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump(report))
    try:
        plot(report, out.with_suffix(".png"))
    except ImportError:
        logger.warning("matplotlib is not installed: no PNG")
    summary = {k: v for k, v in report.items() if k not in ("samples", "latency", "events", "lifetimes", "args")}
    print(json.dumps(summary, indent=2))
    ok = (
        report["training_stopping_exceptions"] == 0
        and report["lost_episodes"] == 0
        and report["http_500"] == 0
        and report["fallbacks"] == 0
    )
    return 0 if ok and internal == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
