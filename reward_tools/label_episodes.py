"""Label collected episodes with the judge, for RLinf's reward-model (success classifier) training.

    python -m reward_tools.label_episodes --url http://127.0.0.1:18080 --episodes DIR --out DIR \\
        [--rule curve --points 8 | --rule score --last-frames 1] [--threshold 0.5] \\
        [--num-samples-per-episode 0 --val-split 0.2 --fail-success-ratio 2.0 --seed 42]

Reads every episode under DIR (RLinf main's `CollectEpisode` pickles, or the earlier form's
positive/negative `.npy` trajectories: reward_tools.episode_files), sends them to the reward
server in raw batches of --batch-size episodes through the RLinf hook's own client (retries,
backoff, one deadline), turns each answer into per-frame success labels by the rule
(reward_tools.frame_labels), and writes, in --out:

- `train.pt` / `val.pt` (RLinf main's `RewardDatasetPayload`, split and sampled as RLinf's own
  preprocessing does, metadata naming the judge, its backend and the rule), or with
  `--format pr301` (the default for `.npy` input) `positive/` and `negative/` directories;
- `agreement.json`: the judge against the simulator's labels where the episodes carry them
  (reward_tools.label_agreement), also printed;
- `judged.jsonl`: the journal, one line per judged episode, appended and synced after every
  batch. A run stopped by a crash or Ctrl-C loses at most the batch in flight: the same command
  again judges only what the journal lacks (changing only --threshold or --last-frames, or the
  split options, re-labels without asking the judge again).

Pickles run code: unpickling a file calls whatever functions it names. Episode files (`*.pkl`,
and the `.npy` files, which are pickles too) are therefore read with a restricted unpickler that
accepts only numpy arrays, dtypes and scalars, torch CPU tensors, plain containers and scalars
(what RLinf writes) and refuses, unrun, any file naming anything else. --trust-pickles reads
them with plain pickle, running whatever they contain: only for files you wrote yourself.
Only regular files are read (a FIFO or a device named `.pkl` is named and skipped); the journal
knows an episode by its content (a SHA-256 hash), so a re-collected file is judged again.

An episode file that cannot be read (or is refused), or that the judge cannot be asked about
or gave no score for, is named (log and report, under `skipped`) and left out; with --strict
the run then writes no dataset and exits 1. One run at a time per --out (a lock file in it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from reward_client.client import RetryPolicy, RewardClient, RewardClientError, RewardRequestError
from reward_protocol.frames import QWEN2_5_VL, FrameSpec
from reward_protocol.score import DEFAULT_MAX_PIXELS, DEFAULT_NFRAMES, BackendKwargs, ScoreOptions
from reward_tools.episode_files import BrokenEpisode, EpisodeFile, Form, find_episodes, read_episode
from reward_tools.frame_labels import LabelRule, episode_score, frame_labels, judge_picks, point_ends
from reward_tools.label_agreement import Judged, agreement_report, summary_lines
from reward_tools.reward_datasets import (
    SplitOptions,
    pr301_images,
    sample_indices,
    write_pr301_dirs,
    write_rlinf_splits,
)

logger = logging.getLogger("reward_tools.label_episodes")

JOURNAL = "judged.jsonl"
REPORT = "agreement.json"
LOCK = ".label_episodes.lock"
JOURNAL_VERSION = "label_episodes/1"


# --- the journal --------------------------------------------------------------------------------


class Journal:
    """Judged episodes on disk: a header line (what was asked; a resumed run must ask the same)
    then one JSON line per episode, appended per batch and synced, so a crash loses at most the
    batch in flight. A last line cut by a crash is ignored."""

    def __init__(self, path: Path, ask: dict[str, Any], restart: bool = False):
        self.path = path
        self.entries: dict[str, dict] = {}
        if restart and path.exists():
            path.unlink()
        if path.exists() and path.stat().st_size:
            self._load(ask)
        else:
            with open(path, "w") as f:
                f.write(json.dumps({"journal": JOURNAL_VERSION, "ask": ask}) + "\n")
        self.resumed = len(self.entries)

    def _load(self, ask: dict[str, Any]) -> None:
        with open(self.path) as f:
            lines = f.read().split("\n")
        header = json.loads(lines[0])
        if header.get("journal") != JOURNAL_VERSION or header.get("ask") != ask:
            raise SystemExit(
                f"label_episodes: {self.path} was written by a run that asked the judge differently "
                f"({header.get('ask')}; this run: {ask}). Use another --out, or --restart to judge everything again."
            )
        body = [line for line in lines[1:] if line.strip()]
        for number, line in enumerate(body):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                if number == len(body) - 1:  # the line a crash cut short: that batch is judged again
                    logger.warning("%s: ignoring an incomplete last line", self.path)
                    self._truncate_to(lines[0], body[:-1])
                    break
                raise SystemExit(
                    f"label_episodes: {self.path} line {number + 2} is not JSON: fix it, or --restart"
                ) from None
            self.entries[entry["name"]] = entry  # a re-judged file's later entry wins

    def _truncate_to(self, header: str, body: list[str]) -> None:
        with open(self.path, "w") as f:
            f.write("\n".join([header, *body]) + "\n")

    def get(self, episode: Prepared) -> dict | None:
        """The episode's entry if the journal judged this very content (a file collected again
        under the same name, even of the same size, has another digest: judged again)."""
        entry = self.entries.get(episode.name)
        return entry if entry is not None and entry.get("sha256") == episode.digest else None

    def append(self, entries: Sequence[dict]) -> None:
        if not entries:
            return
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(e) + "\n" for e in entries))
            f.flush()
            os.fsync(f.fileno())
        for entry in entries:
            self.entries[entry["name"]] = entry


# --- reading ahead ------------------------------------------------------------------------------


@dataclass
class Prepared:
    """What is kept of one episode file: the frames the judge sees, the frames the dataset may
    take, and the simulator's labels (everything else of the file is dropped once read)."""

    name: str
    nbytes: int
    digest: str
    task: str | None
    frames: int
    picks: list[int]
    judge_frames: np.ndarray
    kept: list[int]  # frame indices the dataset may take
    kept_frames: np.ndarray | dict[str, np.ndarray]  # those frames (or a pr301 file's own images)
    sim_labels: np.ndarray | None
    sim_success: bool | None


@dataclass
class Unreadable:
    name: str
    reason: str


def prepare(episode: EpisodeFile, spec: FrameSpec, nframes: int, out_form: Form, split: SplitOptions) -> Prepared:
    frames = len(episode.frames)
    picks = judge_picks(spec, nframes, frames)
    if out_form == "pr301":
        kept = list(range(frames))
        kept_frames: Any = episode.source["images"] if episode.source else episode.frames
    else:
        kept = sample_indices(frames, split.num_samples_per_episode, split.keep_last_frame)
        kept_frames = episode.frames[kept]
    return Prepared(
        name=episode.name,
        nbytes=episode.nbytes,
        digest=episode.digest,
        task=episode.task,
        frames=frames,
        picks=picks,
        judge_frames=np.ascontiguousarray(episode.frames[picks]),
        kept=kept,
        kept_frames=kept_frames,
        sim_labels=episode.sim_labels,
        sim_success=episode.sim_success,
    )


def read_ahead(
    form: Form, paths: Sequence[Path], root: Path, ahead: int, make, read=read_episode
) -> Iterator[Prepared | Unreadable]:
    """Episodes read (`read(form, path, root)`) and prepared in a thread, `ahead` of the caller,
    in file order (reading overlaps judging)."""
    q: queue.Queue = queue.Queue(maxsize=max(ahead, 1))
    done = object()

    def work() -> None:
        try:
            for path in paths:
                try:
                    item: Any = make(read(form, path, root))
                except BrokenEpisode as exc:
                    item = Unreadable(exc.name, exc.reason)
                except OSError as exc:
                    item = Unreadable(path.relative_to(root).as_posix(), f"cannot be read ({exc})")
                q.put(item)
        except BaseException as exc:  # handed to the caller, which raises it
            q.put(exc)
        q.put(done)

    threading.Thread(target=work, name="label-read-ahead", daemon=True).start()
    while (item := q.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item


# --- progress -----------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal; a log line every 10% otherwise."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = time.perf_counter()
        self._logged = -1

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        elapsed = time.perf_counter() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        if self.tty:
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} episodes "
                f"{rate:.1f}/s, {left:.0f} s left {note}".ljust(100)
            )
            self.stream.flush()
        elif (tenth := 10 * self.done // max(self.total, 1)) > self._logged:
            self._logged = tenth
            logger.info("%d/%d episodes (%.1f/s) %s", self.done, self.total, rate, note)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# --- judging ------------------------------------------------------------------------------------


@dataclass
class Labeler:
    client: RewardClient
    spec: FrameSpec
    rule: LabelRule
    nframes: int
    max_pixels: int
    backend: str | None
    score_mode: str | None
    task_text: str | None
    journal: Journal
    not_judged: list[dict] = field(default_factory=list)
    judge_s: float = 0.0
    sent: int = 0
    judged_now: set[str] = field(default_factory=set)

    def judge(self, batch: list[Prepared]) -> None:
        """One raw batch request for these episodes; their answers go to the journal. An
        episode that cannot be asked about (the request schema refuses it) is listed, not sent."""
        asked = []
        for episode in batch:
            task = episode.task or self.task_text
            if not task:
                self.not_judged.append(
                    {"name": episode.name, "reason": "the episode carries no task instruction: pass --task-text"}
                )
                continue
            try:
                options = ScoreOptions(
                    task_text=task,
                    nframes=self.nframes,
                    max_pixels=self.max_pixels,
                    backend=self.backend,
                    backend_kwargs=BackendKwargs(score_mode=self.score_mode),
                    progress_points=self.rule.points_for(self.spec, self.nframes, episode.frames),
                )
            except ValidationError as exc:
                self.not_judged.append({"name": episode.name, "reason": _refused_request(exc)})
                continue
            asked.append((episode, options))
        if asked:
            self._ask(asked)

    def _ask(self, asked: list[tuple[Prepared, ScoreOptions]]) -> None:
        """Send one batch. A batch the server refuses as sent (400/413/422: one episode too large,
        or one it cannot take) is asked again one episode at a time, so the refused one is listed
        under not_judged and the others are judged; a refusal of anything else (401, 404: the
        key, the URL) stops the run."""
        started = time.perf_counter()
        try:
            items = self.client.score_episodes([(options, ep.judge_frames) for ep, options in asked])
        except RewardRequestError as exc:
            if exc.status not in REFUSED_AS_SENT:
                raise
            self.judge_s += time.perf_counter() - started
            if len(asked) == 1:
                self.not_judged.append({"name": asked[0][0].name, "reason": str(exc)})
                return
            logger.warning("the judge refused a batch of %d episodes (%s): asking one at a time", len(asked), exc)
            for one in asked:
                self._ask([one])
            return
        self.judge_s += time.perf_counter() - started
        self.sent += len(asked)
        entries = []
        for (episode, options), item in zip(asked, items, strict=True):
            response = item.response
            curve = response.progress if response is not None else None
            score = response.score if response is not None else None
            if response is None or episode_score(self.rule, score, curve) is None:
                why = (
                    f"{item.error.type}: {item.error.message}"
                    if item.error
                    else f"no score ({response.parse_status.value}: {response.parse_error})"
                )
                self.not_judged.append({"name": episode.name, "reason": why})
                continue
            ends = point_ends(self.spec, self.nframes, episode.picks, len(curve)) if curve else None
            entries.append(
                {
                    "name": episode.name,
                    "bytes": episode.nbytes,
                    "sha256": episode.digest,
                    "frames": episode.frames,
                    "task": options.task_text,
                    "score": score,
                    "curve": curve,
                    "ends": ends,
                    "parse_status": response.parse_status.value,
                    "model_output": response.model_output,
                }
            )
        self.journal.append(entries)
        self.judged_now.update(e["name"] for e in entries)


REFUSED_AS_SENT = (400, 413, 422)


def _refused_request(exc: ValidationError) -> str:
    """A request the schema refuses, said in one line: each field and what is allowed."""
    said = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
    return f"the judge cannot be asked about it ({said})"


# --- the command --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reward_tools.label_episodes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", action="append", required=True, help="reward server (repeat for several)")
    p.add_argument("--episodes", required=True, type=Path, help="collected episodes (*.pkl, or positive/ negative/)")
    p.add_argument("--out", required=True, type=Path, help="where the dataset, report and journal go")
    p.add_argument("--format", choices=["rlinf", "pr301"], default=None, help="default: that of the episodes")
    g = p.add_argument_group("the labeling rule (reward_tools/frame_labels.py)")
    g.add_argument("--rule", choices=["curve", "score"], default="curve")
    g.add_argument("--points", type=int, default=8, help="curve: progress points per episode (K)")
    g.add_argument("--threshold", type=float, default=0.5, help="success at a value >= this")
    g.add_argument("--last-frames", type=int, default=1, help="score: final frames a success labels")
    g = p.add_argument_group("what the judge is asked")
    g.add_argument("--nframes", type=int, default=DEFAULT_NFRAMES)
    g.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS)
    g.add_argument("--backend", default=None, help="must name the server's backend when given")
    g.add_argument("--score-mode", default=None, help="default: the server's")
    g.add_argument("--task-text", default=None, help="instruction for episodes that carry none")
    g.add_argument("--image-key", default=None, help="pr301 input: the image key (default: the only one)")
    g = p.add_argument_group("requests")
    g.add_argument("--batch-size", type=int, default=16, help="episodes per request")
    g.add_argument("--timeout-s", type=float, default=300.0)
    g.add_argument("--deadline-s", type=float, default=900.0, help="per batch, retries included")
    g.add_argument("--wait-ready-s", type=float, default=600.0)
    g.add_argument("--api-key", default=os.environ.get("REWARD_API_KEY"))
    g = p.add_argument_group("split and sampling (as RLinf's examples/reward/preprocess_reward_dataset.py)")
    g.add_argument("--num-samples-per-episode", type=int, default=0, help="0: all frames")
    g.add_argument("--keep-last-frame", dest="keep_last_frame", action="store_true", default=True)
    g.add_argument("--no-keep-last-frame", dest="keep_last_frame", action="store_false")
    g.add_argument("--val-split", type=float, default=0.2)
    g.add_argument("--fail-success-ratio", type=float, default=2.0)
    g.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--trust-pickles",
        action="store_true",
        help="read episode files with plain pickle (np.load with allow_pickle): unpickling runs whatever "
        "code a file names, so only for files you wrote yourself; without it, files naming anything "
        "but numpy arrays, torch tensors, plain containers and scalars are refused unrun",
    )
    p.add_argument("--restart", action="store_true", help="forget the journal and judge everything again")
    p.add_argument("--strict", action="store_true", help="write no dataset (exit 1) if any episode is left out")
    return p


def _label_all(
    paths: Sequence[Path], root: Path, prepared: dict[str, Prepared], journal: Journal, rule: LabelRule
) -> tuple[list[tuple[Prepared, np.ndarray, dict]], list[Judged]]:
    """Every judged episode in file order with its frame labels (the rule applied to the journal)."""
    labeled, judged = [], []
    for path in paths:
        episode = prepared.get(path.relative_to(root).as_posix())
        entry = journal.get(episode) if episode else None
        if entry is None:
            continue
        labels = frame_labels(rule, episode.frames, entry["score"], entry["curve"], entry["ends"])
        labeled.append((episode, labels, entry))
        judged.append(
            Judged(
                name=episode.name,
                task=entry["task"],
                score=float(episode_score(rule, entry["score"], entry["curve"])),
                judge_labels=labels,
                sim_labels=episode.sim_labels,
                sim_success=episode.sim_success,
            )
        )
    return labeled, judged


@contextlib.contextmanager
def out_lock(out: Path) -> Iterator[None]:
    """Hold --out for this run (an flock on a file in it, let go when the process ends however it
    ends): two runs appending to one journal and writing one dataset would mix their files."""
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise SystemExit(
                f"label_episodes: another label_episodes run (pid {holder}) is using {out}: "
                "wait for it to finish, or use another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing lets the lock go


def _judge_failed(exc: RewardClientError, journal: Journal) -> int:
    logger.error(
        "the judge failed: %s; %d judged episodes are kept in %s: run again to resume",
        exc,
        len(journal.entries),
        journal.path,
    )
    return 1


def run(args: argparse.Namespace) -> int:
    root, out = args.episodes.resolve(), args.out.resolve()
    if out == root:
        raise SystemExit("label_episodes: --out must not be the --episodes directory")
    try:
        rule = LabelRule(kind=args.rule, threshold=args.threshold, points=args.points, last_frames=args.last_frames)
        ScoreOptions(task_text="x", nframes=args.nframes, max_pixels=args.max_pixels)  # fail early on bad values
    except ValueError as exc:
        raise SystemExit(f"label_episodes: {exc}") from None
    form, paths = find_episodes(root)
    out_form: Form = args.format or form
    split = SplitOptions(
        args.num_samples_per_episode, args.keep_last_frame, args.val_split, args.fail_success_ratio, args.seed
    )
    out.mkdir(parents=True, exist_ok=True)
    with out_lock(out):
        return _run_locked(args, root, out, form, paths, out_form, rule, split)


def _run_locked(
    args: argparse.Namespace,
    root: Path,
    out: Path,
    form: Form,
    paths: Sequence[Path],
    out_form: Form,
    rule: LabelRule,
    split: SplitOptions,
) -> int:
    ask = {
        "nframes": args.nframes,
        "max_pixels": args.max_pixels,
        "backend": args.backend,
        "score_mode": args.score_mode,
        "rule": rule.kind,
        "points": rule.points if rule.kind == "curve" else 1,
        "task_text": args.task_text,
        "image_key": args.image_key,
    }
    journal = Journal(out / JOURNAL, ask, restart=args.restart)

    client = RewardClient(
        args.url, RetryPolicy(deadline_s=args.deadline_s, timeout_s=args.timeout_s), api_key=args.api_key
    )
    try:
        health = client.wait_until_ready(args.wait_ready_s)
    except RewardClientError as exc:
        client.close()
        return _judge_failed(exc, journal)
    spec = FrameSpec(**health.frame_spec.model_dump()) if health.frame_spec else QWEN2_5_VL
    judge = {"url": args.url, "backend": health.backend, "engine": health.engine, "model": health.model, "asked": ask}
    labeler = Labeler(
        client, spec, rule, args.nframes, args.max_pixels, args.backend, args.score_mode, args.task_text, journal
    )
    logger.info(
        "%d episode files (%s form) in %s; %d already judged in %s; judge %s (%s on %s)",
        len(paths),
        form,
        root,
        journal.resumed,
        out / JOURNAL,
        health.model,
        health.backend,
        health.engine,
    )

    started = time.perf_counter()
    prepared: dict[str, Prepared] = {}
    unreadable: list[dict] = []
    progress = Progress(len(paths))
    pending: list[Prepared] = []

    def flush() -> None:
        labeler.judge(pending)
        progress.update(len(pending))
        pending.clear()

    try:
        make = lambda episode: prepare(episode, spec, args.nframes, out_form, split)  # noqa: E731
        read = lambda form, path, root: read_episode(form, path, root, args.image_key, args.trust_pickles)  # noqa: E731
        for item in read_ahead(form, paths, root, 2 * args.batch_size, make, read):
            if isinstance(item, Unreadable):
                logger.warning("skipping %s: %s", item.name, item.reason)
                unreadable.append({"name": item.name, "reason": item.reason})
                progress.update()
                continue
            prepared[item.name] = item
            if journal.get(item) is not None:
                progress.update()
                continue
            pending.append(item)
            if len(pending) >= args.batch_size:
                flush()
        if pending:
            flush()
    except KeyboardInterrupt:
        progress.close()
        logger.error(
            "interrupted: %d episodes judged so far are kept in %s; the same command resumes",
            len(journal.entries),
            out / JOURNAL,
        )
        return 130
    except RewardClientError as exc:
        progress.close()
        return _judge_failed(exc, journal)
    finally:
        client.close()
    progress.close()
    judging_wall_s = time.perf_counter() - started
    for item in labeler.not_judged:
        logger.warning("not judged: %s: %s", item["name"], item["reason"])

    labeled, judged = _label_all(paths, root, prepared, journal, rule)
    skipped = {"unreadable": unreadable, "not_judged": labeler.not_judged}
    report = agreement_report(judged, rule.threshold, skipped, judge, rule.model_dump())
    report["timing"] = {
        "episodes": len(paths),
        "sent_to_judge": labeler.sent,
        "labeled_from_journal": sum(ep.name not in labeler.judged_now for ep, _, _ in labeled),
        "judging_wall_s": round(judging_wall_s, 3),
        "in_judge_requests_s": round(labeler.judge_s, 3),
    }
    if args.strict and (unreadable or labeler.not_judged):
        logger.error(
            "--strict: %d unreadable and %d unjudged episodes; no dataset written",
            len(unreadable),
            len(labeler.not_judged),
        )
        _write_report(out, report)
        return 1
    if not labeled:
        logger.error("no episode could be labeled; no dataset written")
        _write_report(out, report)
        return 1

    write_started = time.perf_counter()
    metadata = {
        "labeled_by": "reward_tools.label_episodes",
        "raw_data_path": str(root),
        "judge": judge,
        "rule": rule.model_dump(),
        "skipped": {k: [i["name"] for i in v] for k, v in skipped.items()},
    }
    if out_form == "rlinf":
        episodes = [
            ([ep.kept_frames[i] for i in range(len(ep.kept))], [int(labels[k]) for k in ep.kept])
            for ep, labels, _ in labeled
        ]
        written = write_rlinf_splits(out, episodes, split, metadata)
        report["dataset"] = {
            "format": "rlinf",
            "train": str(out / "train.pt"),
            "val": str(out / "val.pt"),
            "num_train_samples": written["num_train_samples"],
            "num_val_samples": written["num_val_samples"],
        }
    else:
        for kind in ("positive", "negative"):
            for old in (out / kind).glob("[0-9]*.npy") if (out / kind).is_dir() else []:
                old.unlink()  # a previous run's files (another threshold) must not stay beside these
        key = args.image_key or "main_images"
        episodes = [
            (ep.kept_frames if isinstance(ep.kept_frames, dict) else pr301_images(ep.kept_frames, key), labels)
            for ep, labels, _ in labeled
        ]
        counts = write_pr301_dirs(out, episodes)
        report["dataset"] = {"format": "pr301", "dir": str(out), **counts, "metadata": metadata}
    report["timing"]["writing_s"] = round(time.perf_counter() - write_started, 3)
    _write_report(out, report)
    for line in summary_lines(report):
        logger.info("%s", line)
    return 0


def _write_report(out: Path, report: dict) -> None:
    text = json.dumps(report, indent=1)
    (out / REPORT).write_text(text + "\n")
    print(text)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except FileNotFoundError as exc:
        raise SystemExit(f"label_episodes: {exc}") from None


if __name__ == "__main__":
    raise SystemExit(main())
