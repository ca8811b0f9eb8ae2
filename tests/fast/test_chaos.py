"""Chaos (fast tier): env workers step envs the way RLinf's LiberoEnv calls the hook, episode after
episode, while faults hit the server: an item failing once, connections cut before the answer,
the server killed and restarted on the same port, other clients stalling uploads, a client naming
huge videos. Under the hook's defaults (fail_on_request_error: True) no fault that resending fixes
may stop training, and every episode is judged; with fail_on_request_error: False a server that
stays away gives counted fallbacks.

Real: the server (a child process, as deployed, on the fake engine: this tier tests the server's
machinery, not the model), HTTP over loopback, httpx, the client, the RLinf hook built from an
RLinf-style config. The one stand-in is the simulator: frames are synthetic (LiberoEnv itself is
driven in tests/test_rlinf_integration.py)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from omegaconf import OmegaConf

from reward_client.rlinf.hook import VLMRewardHook
from reward_tools.launch import ServerProcess, free_port
from tests.helpers.servers import wait_until

ENVS = 4
STEPS = 8  # max_episode_steps
MAX_ROLLOUTS = 200  # per worker: a bound; the test stops the workers once every fault has passed
DECODED_MB = 512  # the decoded-memory budget: a huge-video batch (2 x ~360 MB) must take turns
FLAKY = "FLAKY"  # the fake engine fails each prompt holding this once (engine_request_failed)


class CuttingProxy:
    """A loopback TCP proxy in front of the server. `cut(n)`: the next n answers are dropped and
    their connections closed after the server has done the work (a connection cut before the
    answer). While the server is down, a connection is closed at once."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.to_cut = 0
        self.cuts = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self, n: int) -> None:
        with self.lock:
            self.to_cut += n

    def _take_cut(self) -> bool:
        with self.lock:
            if self.to_cut > 0:
                self.to_cut -= 1
                self.cuts += 1
                return True
            return False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)

        def pump_up() -> None:
            try:
                while data := client.recv(1 << 16):
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                upstream.close()

        threading.Thread(target=pump_up, daemon=True).start()
        try:
            while data := upstream.recv(1 << 16):
                if data.startswith(b"HTTP/") and self._take_cut():
                    break  # the answer never reaches the client
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):  # shutdown: close() alone leaves the other thread's recv blocked
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self.listener.close()


class Server:
    """The server as a child process on a fixed port, killed (SIGKILL) and started again."""

    def __init__(self, tmp: Path, video_root: Path):
        self.port = free_port()
        self.tmp = tmp
        self.flags = [
            "--engine", "fake",
            "--engine-option", f"refuse_once_on={FLAKY}",
            "--engine-option", "delay_ms=20",
            "--video-root", str(video_root),
            "--body-timeout-s", "3",
            "--decode-workers", "1",
            "--max-decoded-mb", str(DECODED_MB),
        ]  # fmt: skip
        self.lives: list[ServerProcess] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = ServerProcess(self.flags, port=self.port, log_path=self.tmp / f"server-{len(self.lives)}.log")
        self.lives.append(server)
        server.start()
        server.wait_ready(120)

    def kill(self) -> None:
        os.killpg(self.lives[-1].proc.pid, signal.SIGKILL)
        self.lives[-1].stop()

    def stop(self) -> None:
        for server in self.lives:
            server.stop()


def rlinf_env_config(url: str, **reward_model) -> object:
    """An RLinf env config node as LiberoEnv hands it to the hook (VLMRewardHook.from_rlinf_config)."""
    rm = {"enable": True, "url": url, "nframes": 4, "wait_ready_s": 60, **reward_model}
    return OmegaConf.create({"reward_model": rm, "ignore_terminations": False, "auto_reset": False})


class EnvWorker:
    """ENVS envs stepped together as LiberoEnv steps them: reset, then on_step every step with the
    envs' task descriptions, terminations (success) and truncations (elapsed >= max steps); the
    rollout ends when every env is done, and the next one resets them all."""

    def __init__(self, name: str, cfg: object, rollouts: int = MAX_ROLLOUTS):
        self.name, self.rollouts = name, rollouts
        self.hook = VLMRewardHook.from_rlinf_config(cfg, ENVS)
        self.stop = threading.Event()
        self.ended = 0
        self.values: list[float] = []
        self.errors: list[BaseException] = []
        self.rng = np.random.default_rng(abs(hash(name)) % 2**32)

    def run(self) -> None:
        try:
            for episode in range(self.rollouts):
                if self.stop.is_set():
                    return
                self.rollout(episode)
        except BaseException as exc:  # what would have stopped training
            self.errors.append(exc)

    def rollout(self, episode: int) -> None:
        tasks = [f"task {i} of {self.name}" for i in range(ENVS)]
        tasks[0] = f"{FLAKY} {self.name} episode {episode}"  # fails once, then is judged
        success_at = [int(self.rng.integers(2, STEPS + 1)) if self.rng.random() < 0.5 else -1 for _ in range(ENVS)]
        frame = lambda t: np.full((ENVS, 64, 64, 3), 10 + 25 * t, np.uint8)  # noqa: E731
        self.hook.on_reset(None, frame(0))
        done = np.zeros(ENVS, bool)
        for t in range(1, STEPS + 1):
            term = np.array([s == t for s in success_at]) & ~done
            trunc = np.full(ENVS, t >= STEPS) & ~done & ~term
            values = self.hook.on_step(frame(t), tasks, term, trunc)
            for env in np.flatnonzero(term | trunc):
                self.values.append(float(values[env]))
            self.ended += int((term | trunc).sum())
            done |= term | trunc


def stall_uploads(url: str, count: int, seconds: float, declared_mb: int) -> list[str]:
    """Clients that declare a body (or send chunks) and trickle a byte a second; what became of each."""
    port = int(url.rsplit(":", 1)[1])
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        length = (
            b"transfer-encoding: chunked\r\n\r\n1\r\n{\r\n"
            if i % 2
            else b"content-length: %d\r\n\r\n{" % (declared_mb * 2**20)
        )
        sock.sendall(b"POST /score/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + length)
        sock.setblocking(False)
        socks.append([sock, i % 2 == 1, None])
    started = time.monotonic()
    while time.monotonic() - started < seconds and any(s[2] is None for s in socks):
        time.sleep(1)
        for entry in socks:
            sock, chunked, outcome = entry
            if outcome is not None:
                continue
            try:
                data = sock.recv(4096)
                entry[2] = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
                continue
            except BlockingIOError:
                pass
            except OSError:
                entry[2] = "reset"
                continue
            try:
                sock.send(b"1\r\n \r\n" if chunked else b" ")
            except OSError:
                entry[2] = "reset"
    for sock, _, _ in socks:
        sock.close()
    return [outcome or "open" for _, _, outcome in socks]


def huge_video_requests(url: str, video: str, count: int) -> list[int]:
    """A client naming a long 720p video with the most frames and pixels the schema allows."""
    item = {"task_text": "huge", "video_path": video, "nframes": 128, "max_pixels": 16384 * 28 * 28}
    codes = []
    for _ in range(count):
        try:
            codes.append(httpx.post(f"{url}/score/batch", json={"requests": [item, item]}, timeout=60).status_code)
        except httpx.TransportError:
            codes.append(0)  # the server was being restarted
    return codes


@pytest.fixture
def huge_video(tmp_path) -> str:
    from reward_client.video_io import write_mp4

    root = tmp_path / "videos"
    root.mkdir()
    x = np.arange(1280, dtype=np.uint16)[None, :] + np.arange(720, dtype=np.uint16)[:, None]
    clip = np.stack([np.repeat(((x + 8 * t) % 256).astype(np.uint8)[:, :, None], 3, axis=2) for t in range(48)])
    return write_mp4(clip, root / "huge.mp4")


def test_training_rides_through_faults_that_resending_fixes(tmp_path, huge_video):
    server = Server(tmp_path, Path(huge_video).parent)
    server.start()
    proxy = CuttingProxy(server.port)
    try:
        # one worker through the proxy (cut answers, dropped connections while the server is down),
        # one straight to the server (connection refused while it is down); raw and inline bodies
        workers = [
            EnvWorker("raw", rlinf_env_config(proxy.url, transport="raw")),
            EnvWorker("inline", rlinf_env_config(server.url, transport="inline")),
        ]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for t in threads:
            t.start()
        progress = lambda: min(w.ended for w in workers)  # noqa: E731
        side: dict[str, list] = {}
        stalls = lambda: side.update(stalls=stall_uploads(server.url, 8, 12, 32))  # noqa: E731
        huge = lambda: side.update(huge=huge_video_requests(server.url, huge_video, 3))  # noqa: E731
        faults = [threading.Thread(target=f, daemon=True) for f in (stalls, huge)]
        broke = lambda: [w.errors for w in workers]  # noqa: E731
        assert wait_until(lambda: progress() >= ENVS, 60), broke()
        for f in faults:
            f.start()
        proxy.cut(2)
        assert wait_until(lambda: proxy.cuts == 2, 60), broke()
        mark = progress()
        assert wait_until(lambda: progress() >= mark + 2 * ENVS, 60), broke()
        for f in faults:
            f.join(60)
        memory = httpx.get(f"{server.url}/stats", timeout=10).json()  # this server lifetime's peak
        server.kill()  # mid-rollout: the workers' next calls meet a dead port
        time.sleep(1)
        server.start()
        proxy.cut(1)
        assert wait_until(lambda: proxy.cuts == 3, 60), broke()
        mark = progress()
        assert wait_until(lambda: progress() >= mark + 2 * ENVS, 60), broke()
        for w in workers:
            w.stop.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    finally:
        proxy.close()
        server.stop()

    for w in workers:
        assert w.errors == [], f"{w.name}: {w.errors!r}"  # nothing that would stop training
        assert w.ended >= 6 * ENVS and w.ended % ENVS == 0  # whole rollouts, through every fault
        counts = w.hook.counts
        assert counts["scored"] == w.ended and counts["fallbacks"] == 0 and counts["request_errors"] == 0, counts
        assert all(v > 0 for v in w.values)  # a judged brightness, never the zero fallback
        assert w.hook.client.attempts > counts["batches"]  # the faults did reach this worker
    assert proxy.cuts == 3
    assert len(server.lives) == 2
    assert side["huge"] == [200] * 3, side  # answered (items scored or refused), never a 5xx
    assert side["stalls"] == ["408"] * 8, side  # closed by the body's total deadline, not left open
    # decoded frames stayed within the budget, and were admitted against it
    assert memory["decoded_mb_budget"] == DECODED_MB and 0 < memory["decoded_mb_peak"] <= DECODED_MB * 1.1, memory


def test_a_server_that_stays_away_gives_counted_fallbacks_when_asked(tmp_path):
    """fail_on_request_error: False: an episode whose judge cannot be reached before the deadline
    gets the configured fallback, counted (env/vlm_fallback); the next rollout, with the server
    back, is judged again."""
    server = Server(tmp_path, tmp_path)
    server.start()
    try:
        cfg = rlinf_env_config(server.url, fail_on_request_error=False, deadline_s=2.0, fallback="env_success")
        worker = EnvWorker("lenient", cfg, rollouts=1)
        server.kill()
        worker.run()
        assert worker.errors == []
        counts = worker.hook.counts
        assert counts["fallbacks"] == ENVS and counts["request_errors"] >= 1 and counts["scored"] == 0, counts
        assert worker.hook.episode_info()["vlm_fallback"].tolist() == [1.0] * ENVS
        server.start()
        worker.run()
        assert worker.errors == [] and worker.hook.counts["scored"] == ENVS
        # the default (fail_on_request_error: True) is loud: no silent zeros
        strict = EnvWorker("strict", rlinf_env_config(server.url, deadline_s=2.0), rollouts=1)
        server.kill()
        strict.run()
        assert len(strict.errors) == 1 and isinstance(strict.errors[0], RuntimeError)
        assert "fail_on_request_error" in str(strict.errors[0])
    finally:
        server.stop()
