"""Can the judge tell success from failure on your episodes? Score a labeled set through running
servers and report.

    python -m reward_tools.evaluate --manifest episodes.jsonl --server qwen=http://127.0.0.1:18080 \\
        [--server primo=http://127.0.0.1:18081] [--score-mode auto --score-mode logprob] --out reports/judge

The manifest (JSONL or CSV; or a directory holding manifest.jsonl) has one episode per row:
`video` (an MP4 path, relative to the manifest), `task` (the instruction), `success` (0/1), and
optionally `progress` (0-1 or 0-100), `trajectory` and `t` (clips of one trajectory in time
order, for the value-order correlation). Videos are sent inline, so the server need not see
your files. Every (server, score mode) pair is one judge configuration; all appear in one report.

Writes OUT.md and OUT.json, plus per configuration OUT-<name>-hist.png (score histograms per
label), OUT-<name>-reliability.png, OUT-<name>-canary.png and OUT-<name>-tasks.png, and OUT-roc.png
(all configurations). Canary probes (the first frame repeated, the episode reversed, another
task's instruction; --canary-fraction of the episodes) and per-task numbers are those of the live
audit in RLinf's env (reward_tools/eval_audit.py).
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from reward_client.client import RetryPolicy, RewardClient
from reward_protocol.score import BackendKwargs, ScoreRequest
from reward_tools import eval_audit
from reward_tools import eval_metrics as m

logger = logging.getLogger("reward_tools.evaluate")


@dataclass
class Episode:
    video: Path
    task: str
    success: bool
    progress: float | None = None
    trajectory: str | None = None
    t: float | None = None


@dataclass
class Scored:
    config: str
    scores: list[float | None] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def _truthy(value) -> bool:
    if isinstance(value, str):
        if value.strip().lower() in ("1", "true", "yes", "success", "y"):
            return True
        if value.strip().lower() in ("0", "false", "no", "failure", "fail", "n", ""):
            return False
        raise ValueError(f"success must be 0/1 or true/false, got {value!r}")
    return bool(value)


def load_manifest(path: str | Path) -> list[Episode]:
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.jsonl"
    if not path.exists():
        raise SystemExit(f"evaluate: no manifest at {path}")
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    episodes = []
    for i, row in enumerate(rows, 1):
        try:
            video = Path(row["video"])
            video = video if video.is_absolute() else path.parent / video
            progress = row.get("progress")
            progress = None if progress in (None, "") else float(progress)
            if progress is not None and progress > 1.0:
                progress /= 100.0
            t = row.get("t")
            episodes.append(
                Episode(
                    video,
                    str(row["task"]),
                    _truthy(row["success"]),
                    progress,
                    row.get("trajectory") or None,
                    None if t in (None, "") else float(t),
                )
            )
        except (KeyError, ValueError) as exc:
            raise SystemExit(f"evaluate: {path} row {i}: {exc} (needs video, task, success)") from None
        if not video.exists():
            raise SystemExit(f"evaluate: {path} row {i}: video {video} does not exist")
    if not episodes:
        raise SystemExit(f"evaluate: {path} lists no episodes")
    return episodes


def score_all(
    client: RewardClient, config: str, episodes: list[Episode], score_mode: str | None, nframes: int, batch_size: int
) -> Scored:
    result = Scored(config)
    started = time.perf_counter()
    for start in range(0, len(episodes), batch_size):
        chunk = episodes[start : start + batch_size]
        requests = [
            ScoreRequest(
                task_text=e.task,
                video_b64=base64.b64encode(e.video.read_bytes()).decode(),
                nframes=nframes,
                backend_kwargs=BackendKwargs(score_mode=score_mode),
            )
            for e in chunk
        ]
        for item in client.score_batch(requests):
            if item.response is None:
                result.scores.append(None)
                result.statuses.append(f"error:{item.error.type}")
                result.latencies_ms.append(float("nan"))
            else:
                result.scores.append(item.response.score)
                result.statuses.append(item.response.parse_status.value)
                result.latencies_ms.append(item.response.timings.total_ms)
    result.wall_s = time.perf_counter() - started
    return result


def summarize(scored: Scored, episodes: list[Episode], threshold: float) -> dict:
    valid = [i for i, s in enumerate(scored.scores) if s is not None]
    scores = np.array([scored.scores[i] for i in valid], float)
    labels = np.array([episodes[i].success for i in valid], bool)
    latencies = [x for x in scored.latencies_ms if x == x]
    report: dict = {
        "config": scored.config,
        "episodes": len(episodes),
        "scored": len(valid),
        "parse_failure_rate": 1 - len(valid) / len(episodes),
        "statuses": dict(sorted({s: scored.statuses.count(s) for s in scored.statuses}.items())),
        "auroc": m.auroc(scores, labels),
        "at_threshold": asdict(m.classify_at(scores, labels, threshold)),
        "at_best_threshold": asdict(m.best_threshold(scores, labels)),
        "latency_ms_p50": statistics.median(latencies) if latencies else None,
        "latency_ms_p95": float(np.percentile(latencies, 95)) if latencies else None,
        "wall_s": scored.wall_s,
        "episodes_per_s": len(episodes) / scored.wall_s if scored.wall_s else None,
    }
    bins, ece = m.calibration(scores, labels)
    report["calibration"] = [asdict(b) for b in bins]
    report["ece"] = ece
    with_progress = [i for i in valid if episodes[i].progress is not None]
    if len(with_progress) >= 2:
        report["spearman_progress"] = m.spearman(
            [scored.scores[i] for i in with_progress], [episodes[i].progress for i in with_progress]
        )
    timed = [i for i in valid if episodes[i].trajectory is not None and episodes[i].t is not None]
    if timed:
        report["voc"] = m.value_order_correlation(
            [scored.scores[i] for i in timed], [episodes[i].trajectory for i in timed], [episodes[i].t for i in timed]
        )
    return report


def plots(out: Path, results: list[tuple[Scored, dict]], episodes: list[Episode]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig_roc, ax_roc = plt.subplots(figsize=(5, 5))
    for scored, report in results:
        valid = [i for i, s in enumerate(scored.scores) if s is not None]
        scores = np.array([scored.scores[i] for i in valid], float)
        labels = np.array([episodes[i].success for i in valid], bool)
        name = scored.config.replace("/", "_")

        fig, ax = plt.subplots(figsize=(6, 3.5))
        bins = np.linspace(0, 1, 21)
        ax.hist(scores[labels], bins=bins, alpha=0.6, label=f"success (n={labels.sum()})", color="C2")
        ax.hist(scores[~labels], bins=bins, alpha=0.6, label=f"failure (n={(~labels).sum()})", color="C3")
        ax.set(title=f"{scored.config}: scores by label", xlabel="score", ylabel="episodes")
        ax.legend()
        fig.tight_layout()
        written.append(out.parent / f"{out.name}-{name}-hist.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(4.5, 4.5))
        filled = [b for b in report["calibration"] if b["count"]]
        ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect")
        ax.plot([b["mean_score"] for b in filled], [b["success_rate"] for b in filled], "o-", label="judge")
        for b in filled:
            ax.annotate(
                str(b["count"]),
                (b["mean_score"], b["success_rate"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
        ax.set(
            title=f"{scored.config}: reliability (ECE {report['ece']:.3f})",
            xlabel="mean score in bin",
            ylabel="success rate",
            xlim=(0, 1),
            ylim=(0, 1),
        )
        ax.legend(loc="upper left")
        fig.tight_layout()
        written.append(out.parent / f"{out.name}-{name}-reliability.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

        if labels.any() and (~labels).any():
            fpr, tpr, _ = m.roc_curve(scores, labels)
            ax_roc.plot(fpr, tpr, label=f"{scored.config} (AUROC {report['auroc']:.3f})")
    ax_roc.plot([0, 1], [0, 1], "--", color="grey")
    ax_roc.set(title="ROC", xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1), ylim=(0, 1))
    ax_roc.legend(loc="lower right", fontsize=8)
    fig_roc.tight_layout()
    written.append(out.parent / f"{out.name}-roc.png")
    fig_roc.savefig(written[-1], dpi=110)
    plt.close(fig_roc)
    return written


def markdown(reports: list[dict], images: list[Path], threshold: float, extra: Sequence[str] = ()) -> str:
    fmt = lambda v, d=3: "n/a" if v is None else f"{v:.{d}f}"  # noqa: E731
    lines = [
        "# Reward judge evaluation",
        "",
        f"| config | episodes | parse failures | AUROC | acc@{threshold:g} | F1@{threshold:g} | best threshold "
        "| acc@best | F1@best | ECE | Spearman (progress) | VOC | p50 ms | eps/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r['config']} | {r['episodes']} | {r['parse_failure_rate']:.1%} | {fmt(r['auroc'])} "
            f"| {fmt(r['at_threshold']['accuracy'])} | {fmt(r['at_threshold']['f1'])} "
            f"| {fmt(r['at_best_threshold']['threshold'])} | {fmt(r['at_best_threshold']['accuracy'])} "
            f"| {fmt(r['at_best_threshold']['f1'])} | {fmt(r['ece'])} | {fmt(r.get('spearman_progress'))} "
            f"| {fmt(r.get('voc'))} | {fmt(r['latency_ms_p50'], 0)} | {fmt(r['episodes_per_s'], 2)} |"
        )
    for r in reports:
        lines += [
            "",
            f"## {r['config']}",
            "",
            f"Parse statuses: {r['statuses']}",
            "",
            "| bin | episodes | mean score | success rate |",
            "|---|---|---|---|",
        ]
        for b in r["calibration"]:
            lines.append(
                f"| {b['low']:.1f}-{b['high']:.1f} | {b['count']} | {fmt(b['mean_score'])} | {fmt(b['success_rate'])} |"
            )
    lines += [*extra, "", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--manifest", required=True, help="JSONL / CSV file, or a directory with manifest.jsonl")
    parser.add_argument("--server", action="append", required=True, metavar="NAME=URL")
    parser.add_argument("--score-mode", action="append", default=None, help="repeat to compare (default: server's)")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--nframes", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--canary-fraction", type=float, default=1.0, help="episodes also sent as probes; 0: none")
    parser.add_argument("--out", required=True, help="output prefix: OUT.md, OUT.json, OUT-*.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)

    episodes = load_manifest(args.manifest)
    logger.info("%d episodes (%d successes)", len(episodes), sum(e.success for e in episodes))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    probes = eval_audit.build_probes(episodes, args.nframes, args.canary_fraction)
    results = []
    for spec in args.server:
        name, sep, url = spec.partition("=")
        if not sep:
            parser.error(f"--server takes NAME=URL, got {spec!r}")
        client = RewardClient(url, RetryPolicy(deadline_s=3600, timeout_s=3600), api_key=args.api_key)
        client.wait_until_ready(600)
        for mode in args.score_mode or [None]:
            config = name if mode is None else f"{name}/{mode}"
            scored = score_all(client, config, episodes, mode, args.nframes, args.batch_size)
            report = summarize(scored, episodes, args.threshold)
            probe_scores = eval_audit.score_probes(client, probes, mode, args.batch_size)
            labels, tasks = [e.success for e in episodes], [e.task for e in episodes]
            report |= eval_audit.audit_report(scored.scores, labels, tasks, args.threshold, probes, probe_scores)
            failures = 100 * report["parse_failure_rate"]
            logger.info("%s: AUROC %s, parse failures %.1f%%", config, report["auroc"], failures)
            results.append((scored, report))
    reports = [r for _, r in results]
    images = plots(out, results, episodes) + eval_audit.plots(out, reports)
    out.with_suffix(".json").write_text(json.dumps({"threshold": args.threshold, "configs": reports}, indent=2))
    out.with_suffix(".md").write_text(
        markdown(reports, images, args.threshold, eval_audit.markdown(reports, args.threshold))
    )
    logger.info("wrote %s, %s and %d plots", out.with_suffix(".md"), out.with_suffix(".json"), len(images))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
