"""Shared fixtures: the tiny checkpoint (built once per session) and real server processes.

Servers run as child processes bound to 127.0.0.1 on a free port and are stopped at the end
of the session, whatever happens. Every process the suite starts carries a session mark in its
environment; one still alive when the suite ends (an orphan included) fails the run.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from reward_client.protocol import InlineFrames
from reward_tools.launch import ServerProcess

REPO = Path(__file__).resolve().parents[1]
CPU_PRESET = REPO / "configs" / "server" / "cpu_tiny.yaml"
SESSION_MARK = "REWARD_SERVER_TEST_SESSION"
# A generation that is still running when a test acts on it (a client leaving, a deadline, a
# drain). Its length in tokens alone said nothing about its length in time: 8192 tokens (~14 s on
# an idle machine) all ended before a busy 2-core machine answered /stats. So the engine's steps
# get a floor (reward_server/engines/step_floor.py): LONG_TOKENS run for at least
# LONG_TOKENS * STEP_FLOOR_MS (40 s) however fast the machine generates, and tests act once the
# engine reports the request's first token (/stats `first_tokens`, see first_token_seen).
STEP_FLOOR_MS = 10
LONG_TOKENS = 4000
STEP_FLOOR_FLAGS = ("--engine-option", f"step_floor_ms={STEP_FLOOR_MS}")
LONG_FLAGS = ("--max-model-len", "16384", "--max-tokens-limit", str(LONG_TOKENS), *STEP_FLOOR_FLAGS)


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--docker",
        action="store_true",
        default=False,
        help="also run the tests marked docker: build the server's image and run it on a Docker engine "
        "(started if none is running; ~15 min cold)",
    )


def pytest_configure(config) -> None:
    # inherited by every process the tests start, however deep, even once re-parented to init
    os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)


def pytest_collection_modifyitems(config, items) -> None:
    if config.getoption("--docker"):
        return
    skip = pytest.mark.skip(
        reason="opt-in (builds and runs the container image, ~15 min): python -m pytest --docker tests/test_docker.py"
    )
    for item in items:
        if item.get_closest_marker("docker") is not None:
            item.add_marker(skip)


def _marked_processes() -> list[int]:
    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if mark not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                # multiprocessing's resource tracker of this very process: it ends when pytest does
                if b"multiprocessing.resource_tracker" in fh.read() and _parent(int(entry)) == os.getpid():
                    continue
            found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        return f"{pid}: {cmdline[:160]}"
    except OSError:
        return f"{pid}: (gone)"


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a process started by the tests outlives them (and stop it)."""
    if not os.path.isdir("/proc") or SESSION_MARK not in os.environ:
        return
    deadline = time.monotonic() + 15  # fixtures just sent SIGTERM; let processes finish exiting
    left = _marked_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = _marked_processes()
    if not left:
        return
    described = [_describe(pid) for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = "processes started by the tests were still running at the end (killed now):\n  " + "\n  ".join(described)
    if reporter is not None:
        reporter.write_sep("=", "leftover processes", red=True)
        reporter.write_line(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    from reward_server.tiny_checkpoint import ensure_checkpoint

    cache = os.environ.get("REWARD_SERVER_TEST_CHECKPOINT")
    path = Path(cache) if cache else tmp_path_factory.mktemp("ckpt") / "tiny"
    return str(ensure_checkpoint(path))


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    """Where tests write episodes for video_path requests; the servers allow only this root."""
    return tmp_path_factory.mktemp("videos")


def episode_frames(steps: int = 24, size: int = 64, seed: int = 0) -> np.ndarray:
    """Frames that change over the episode (a block moving across a noisy background)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 60, size=(steps, size, size, 3), dtype=np.uint8)
    for t in range(steps):
        x = int((size - 12) * t / max(1, steps - 1))
        frames[t, 20:32, x : x + 12] = (220, 40, 40)
    return frames


def inline(frames: np.ndarray) -> dict:
    return InlineFrames.from_array(frames).model_dump(mode="json")


def audit_by_hand(scores: list[float], labels: list[bool], threshold: float) -> dict[str, float]:
    """The audit's numbers for a handful of episodes, computed the long way."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    bins: dict[int, list[tuple[float, bool]]] = {}
    for s, y in zip(scores, labels, strict=True):
        bins.setdefault(min(int(s * 10), 9), []).append((s, y))
    ece = sum(
        len(b) / len(scores) * abs(sum(s for s, _ in b) / len(b) - sum(y for _, y in b) / len(b)) for b in bins.values()
    )

    def quality(t: float) -> tuple[float, float, float]:
        tp = sum(s >= t for s in pos)
        fp = sum(s >= t for s in neg)
        acc = (tp + sum(s < t for s in neg)) / len(scores)
        f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if tp else 0.0
        return acc, f1, -t

    return {
        "episodes": len(scores),
        "auroc": wins / (len(pos) * len(neg)),
        "fpr": sum(s >= threshold for s in neg) / len(neg),
        "fnr": sum(s < threshold for s in pos) / len(pos),
        "ece": ece,
        "score_success": sum(pos) / len(pos),
        "score_failure": sum(neg) / len(neg),
        "best_threshold": max(scores, key=quality),
    }


def start_server(extra_flags: list[str], checkpoint: str, video_dir: Path, log_dir: Path) -> ServerProcess:
    flags = ["--config", str(CPU_PRESET), "--model-path", checkpoint, "--video-root", str(video_dir), *extra_flags]
    server = ServerProcess(flags, log_path=log_dir / f"server-{'-'.join(extra_flags[:2]) or 'default'}.log")
    server.start()
    try:
        server.wait_ready(600)
    except Exception:
        server.stop()
        raise
    return server


def _served(flags: list[str], checkpoint: str, video_dir: Path, tmp_path_factory):
    server = start_server(flags, checkpoint, video_dir, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_checkpoint, video_dir, tmp_path_factory):
    """The vllm engine with the Qwen profile (vLLM schedules continuously: no batch wait to set)."""
    flags = ["--engine", "vllm", *LONG_FLAGS]
    yield from _served(flags, tiny_checkpoint, video_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def hf_server(tiny_checkpoint, video_dir, tmp_path_factory):
    """The transformers engine; its micro-batches wait 300 ms (not 100) so a busy 2-core machine's
    concurrent requests still meet in one forward pass."""
    flags = ["--engine", "hf", "--batch-wait-ms", "300", *LONG_FLAGS]
    yield from _served(flags, tiny_checkpoint, video_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def primo_hf_server(tiny_checkpoint, video_dir, tmp_path_factory):
    flags = ["--engine", "hf", "--backend", "PRIMO-R1", "--max-tokens", "8"]
    yield from _served(flags, tiny_checkpoint, video_dir, tmp_path_factory)
