"""Hostile input that takes time or memory to show: a long 720p video decoded within a memory
budget, decode budgets refusing with 413 while the pool recovers, slow and oversized request
heads, concurrent huge bodies refused before they take memory, JSON bodies up to the derived
limit."""

from __future__ import annotations

import concurrent.futures as cf
import json
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from reward_client.video_io import encode_mp4
from reward_tools.launch import ServerProcess
from tests.helpers.episodes import TASK, episode_frames, inline
from tests.helpers.servers import InProcessServer, post, post_path, still_serves


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("root")


@pytest.fixture(scope="module")
def long_720p(root) -> Path:
    """600 frames of 1280x720 in a few hundred KB: every frame kept would be 1.6 GB of RGB."""
    import av

    path = root / "long_720p.mp4"
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 1280, 720, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "35"}
        frame = np.zeros((720, 1280, 3), np.uint8)
        for t in range(600):
            frame[:, :, :] = 40
            frame[300:420, (t * 2) % 1200 : (t * 2) % 1200 + 80] = 250
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def _rss_tree(pid: int) -> int:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])


def json_batch(episodes: int, frames: np.ndarray) -> bytes:
    item = {"task_text": TASK, "frames": inline(frames)}
    return json.dumps({"requests": [item] * episodes}).encode()


def test_long_video_decodes_within_a_memory_budget_below_keeping_its_frames(root, long_720p):
    # 700 MB for a worker that, keeping every frame, would need 1.6 GB: only picked frames are kept
    with InProcessServer(video_roots=[str(root)], decode_memory_mb=700) as s:
        r = post_path(s, long_720p, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["nframes"] == 16
        assert s.service.pool.replaced == 0


def test_decode_budgets_refuse_with_413_and_the_pool_recovers(root, long_720p):
    with InProcessServer(video_roots=[str(root)], max_video_frames=100, max_frame_pixels=640 * 480) as s:
        started = time.monotonic()
        r = post_path(s, long_720p)
        assert r.status_code == 413 and r.json()["error"]["type"] == "video_too_large", r.text
        assert "pixels per frame" in r.json()["error"]["message"]
        assert time.monotonic() - started < 5  # refused from the stream's header, nothing decoded
    with InProcessServer(video_roots=[str(root)], max_video_frames=100) as s:
        r = post_path(s, long_720p)
        assert r.status_code == 413 and "more than 100 frames" in r.json()["error"]["message"]
        still_serves(s, root)
    heavy = root / "heavy_1080p.mp4"
    heavy.write_bytes(encode_mp4(np.random.default_rng(0).integers(0, 255, (20, 1080, 1920, 3), dtype=np.uint8)))
    with InProcessServer(video_roots=[str(root)], decode_timeout_s=1.0) as s:
        r = post_path(s, heavy)  # 20 frames of 1080p noise: seconds to decode
        assert r.status_code == 413 and "longer than the 1 s budget" in r.json()["error"]["message"]
        assert s.service.pool.replaced == 1  # the stuck worker was killed and replaced
        still_serves(s, root)
    with InProcessServer(video_roots=[str(root)], decode_memory_mb=256) as s:
        # 40 frames of 1080p asked for (20 decoded, 250 MB stacked): over a 256 MB budget
        r = post(f"{s.url}/score", json={"task_text": TASK, "video_path": str(heavy), "nframes": 40}, timeout=60)
        assert r.status_code == 413 and "memory" in r.json()["error"]["message"], r.text
        still_serves(s, root)


def test_slow_and_oversized_request_heads_are_cut_off(root):
    with InProcessServer(video_roots=[str(root)], header_timeout_s=1, body_timeout_s=1) as s:
        host, port = "127.0.0.1", s.settings.port
        slow = []
        for _ in range(200):  # slowloris: heads that never finish
            sock = socket.create_connection((host, port))
            sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
            slow.append(sock)
        idle = socket.create_connection((host, port))  # sends nothing at all
        time.sleep(2.5)
        for sock in [*slow, idle]:
            sock.settimeout(2)
            data = sock.recv(1024)
            assert data == b"" or data.startswith(b"HTTP/1.1 408"), data[:80]
            sock.close()
        big = socket.create_connection((host, port))
        big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n")
        big.settimeout(5)
        assert big.recv(1024).startswith(b"HTTP/1.1 431")
        big.close()
        stall = socket.create_connection((host, port))  # a body that stops half-way
        stall.sendall(
            b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        stall.settimeout(5)
        assert stall.recv(4096).startswith(b"HTTP/1.1 408")
        stall.close()
        assert s.service.admission.bytes == 0
        still_serves(s, root)


def test_concurrent_huge_bodies_are_refused_before_they_take_memory(tmp_path):
    flags = ["--engine", "fake", "--decode-workers", "1", "--max-inflight-mb", "150", "--max-body-mb", "120"]
    flags += ["--engine-option", "delay_ms=3000", "--video-root", str(tmp_path)]
    with ServerProcess(flags, log_path=tmp_path / "server.log") as server:
        server.wait_ready(60)
        baseline = _rss_tree(server.proc.pid)
        frames = np.random.default_rng(0).integers(0, 255, (100, 512, 512, 3), dtype=np.uint8)  # ~100 MB of JSON
        payload = httpx.Request("POST", "/", json={"task_text": TASK, "frames": inline(frames)}).content
        peak = baseline
        with cf.ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(
                    httpx.post,
                    f"{server.url}/score",
                    content=payload,
                    headers={"content-type": "application/json"},
                    timeout=60,
                )
                for _ in range(4)
            ]
            while not all(f.done() for f in futures):
                peak = max(peak, _rss_tree(server.proc.pid))
                time.sleep(0.05)
        codes = sorted(f.result().status_code for f in futures)
        assert codes.count(200) >= 1 and codes.count(503) >= 2, codes
        # one 100 MB body admitted at a time: parse (worker) + frames, never four bodies at once
        assert peak - baseline < 900 * 2**20, (peak - baseline) / 2**20
        assert (
            post(f"{server.url}/score", json={"task_text": TASK, "frames": inline(episode_frames(4))}).status_code
            == 200
        )


def test_json_bodies_up_to_the_derived_limit_parse_and_memory_errors_are_413(root):
    """With --decode-memory-mb 256 a JSON body may be 16 MiB (256 / 16): one just under it parses
    in a worker and is scored; one above is a 413 from its Content-Length, and the same episodes
    as a raw batch are scored; a body under the limit whose parse needs more memory than the
    worker has (millions of tiny values) is a 413 naming the budget, never a 422 "not valid
    JSON" (before: either a 422 or a 400 invalid_video from the dead worker)."""
    limit = 256 * 1024 * 1024 // 16
    frames = np.random.default_rng(1).integers(0, 60, (40, 128, 128, 3), np.uint8)
    with InProcessServer(video_roots=[str(root)], decode_memory_mb=256, decode_timeout_s=30) as s:
        under = json_batch(6, frames)
        assert 0.8 * limit < len(under) < limit, len(under)
        r = post(f"{s.url}/score/batch", content=under, headers={"content-type": "application/json"}, timeout=120)
        assert r.status_code == 200 and all(i["response"] for i in r.json()["results"]), r.text[:300]

        over = json_batch(8, frames)
        assert len(over) > limit
        r = post(f"{s.url}/score/batch", content=over, headers={"content-type": "application/json"}, timeout=120)
        assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large", r.text[:300]
        assert "--decode-memory-mb 256" in r.json()["error"]["message"]
        from reward_protocol import raw_batch
        from reward_protocol.score import ScoreOptions

        raw = raw_batch.encode([(ScoreOptions(task_text=TASK), frames)] * 8).tobytes()
        r = post(f"{s.url}/score/batch", content=raw, headers={"content-type": raw_batch.CONTENT_TYPE}, timeout=120)
        assert r.status_code == 200 and all(i["response"] for i in r.json()["results"]), r.text[:300]

        tiny_values = b'{"requests": [], "x": [' + b"[]," * (limit // 3 - 20) + b"[]]}"
        assert len(tiny_values) < limit
        r = post(f"{s.url}/score/batch", content=tiny_values, headers={"content-type": "application/json"}, timeout=120)
        assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large", r.text[:300]
        assert "--decode-memory-mb" in r.json()["error"]["message"], r.text[:300]
        still_serves(s, root)
