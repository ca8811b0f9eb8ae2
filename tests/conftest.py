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

import pytest

from tests.helpers.rlinf import make_trees, rlinf_main_checkout
from tests.helpers.servers import LONG_FLAGS, start_server

SESSION_MARK = "REWARD_SERVER_TEST_SESSION"


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
    base = os.environ.setdefault(SESSION_MARK, uuid.uuid4().hex)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None and hasattr(config, "workerinput"):
        # each xdist worker marks its own processes (the other worker's are not its leftovers); the
        # worker's own /proc environ keeps the base mark, which no worker looks for
        os.environ[SESSION_MARK] = f"{base.split('-')[0]}-{worker}"


def _distributed(config) -> bool:
    """Whether this process is the controller of xdist workers (which each check their own)."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


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


LEFTOVER_KEY = "leftover_processes"
_LEFTOVER = pytest.StashKey[list]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: a worker's leftover processes (it stopped them) fail the whole run."""
    left = getattr(node, "workeroutput", {}).get(LEFTOVER_KEY)
    if left:
        node.config.stash.setdefault(_LEFTOVER, []).extend(left)


def _report_leftovers(session, described: list[str]) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = "processes started by the tests were still running at the end (killed now):\n  " + "\n  ".join(described)
    if reporter is not None:
        reporter.write_sep("=", "leftover processes", red=True)
        reporter.write_line(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a process started by the tests outlives them (and stop it)."""
    if _distributed(session.config):
        if session.config.stash.get(_LEFTOVER, []):
            _report_leftovers(session, session.config.stash[_LEFTOVER])
        return
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
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller reports it
        session.config.workeroutput[LEFTOVER_KEY] = described
    _report_leftovers(session, described)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    from reward_server.tiny_checkpoint import ensure_checkpoint

    cache = os.environ.get("REWARD_SERVER_TEST_CHECKPOINT")
    path = Path(cache) if cache else tmp_path_factory.mktemp("ckpt") / "tiny"
    return str(ensure_checkpoint(path))


@pytest.fixture(scope="session")
def tiny_qwen3_checkpoint(tmp_path_factory) -> str:
    """A random-weight Qwen3-VL checkpoint (tiny_checkpoint --preset qwen3_vl), built once per session."""
    from reward_server.tiny_checkpoint import PRESETS, ensure_checkpoint

    cache = os.environ.get("REWARD_SERVER_TEST_QWEN3_CHECKPOINT")
    path = Path(cache) if cache else tmp_path_factory.mktemp("ckpt") / "tiny-qwen3-vl"
    return str(ensure_checkpoint(path, PRESETS["qwen3_vl"]))


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory) -> Path:
    """Where tests write episodes for video_path requests; the servers allow only this root."""
    return tmp_path_factory.mktemp("videos")


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


@pytest.fixture(scope="session")
def rlinf_trees(tmp_path_factory) -> dict[str, Path]:
    """RLinf v0.3's source twice: as released, and patched with the run configs installed next to
    RLinf's v0.3 config groups (tests/helpers/rlinf.py)."""
    return make_trees(tmp_path_factory)


@pytest.fixture(scope="session")
def rlinf_main(tmp_path_factory) -> Path:
    """An RLinf main checkout (tests/helpers/rlinf.py says where it comes from)."""
    return rlinf_main_checkout(tmp_path_factory)
