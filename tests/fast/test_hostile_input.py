"""Hostile or broken input against a live server (the real app, uvicorn and decode workers; the
model is the fake engine, since none of this reaches a model). Each case checks the answer,
that nothing outside the allowed roots was read or waited for, where it matters the memory
spent, and that a valid request is answered correctly afterwards."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import struct
import time
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from reward_client.video_io import encode_mp4, write_mp4
from reward_tools.bench_chat import frame, jpeg_data_url
from tests.helpers.episodes import TASK, episode_frames
from tests.helpers.servers import (
    CHAT,
    InProcessServer,
    chat_body,
    data_url,
    get,
    image_part,
    openai_error,
    png_bytes,
    post,
    post_path,
    still_serves,
)

NOT_A_CONTAINER = "not a video container this server reads"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("root")


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A real video the server must never read (it lies outside the allowed root)."""
    path = tmp_path_factory.mktemp("outside") / "secret.mp4"
    write_mp4(np.full((4, 56, 56, 3), 255, np.uint8), path)
    return path


@pytest.fixture(scope="module")
def server(root):
    with InProcessServer(video_roots=[str(root)], decode_workers=2, decode_timeout_s=20) as s:
        yield s


def referring_files(root: Path, target: Path) -> dict[str, Path]:
    """Media files whose demuxers would open another file."""
    files = {
        "hls.m3u8": f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{target}\n#EXT-X-ENDLIST\n",
        "concat.txt": f"ffconcat version 1.0\nfile '{target}'\n",
        "dash.mpd": f'<?xml version="1.0"?><MPD><Period><BaseURL>{target}</BaseURL></Period></MPD>',
        "stream.sdp": "v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\nm=video 5004 RTP/AVP 96\n",
        "frame%03d.png": None,
        "playlist.mp4": f"#EXTM3U\n#EXTINF:10,\n{target}\n",  # a playlist named like a video
    }
    paths = {}
    for name, text in files.items():
        path = root / name
        if text is None:  # an image sequence pattern: the file itself is a PNG
            path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
        else:
            path.write_text(text)
        paths[name] = path
    return paths


def test_media_that_refers_to_other_files_is_refused(server, root, outside):
    assert post_path(server, outside).status_code == 403  # asked for directly: refused
    for name, path in referring_files(root, outside).items():
        r = post_path(server, path)
        assert r.status_code == 400, (name, r.text)
        assert NOT_A_CONTAINER in r.json()["error"]["message"], name
        assert str(outside) not in r.text
        # the same bytes inline are refused the same way
        data = base64.b64encode(path.read_bytes()).decode()
        r = post(f"{server.url}/score", json={"task_text": TASK, "video_b64": data})
        assert r.status_code == 400 and NOT_A_CONTAINER in r.json()["error"]["message"], name
    still_serves(server, root)


def test_fifos_devices_and_links_out_never_block_or_leak(server, root):
    fifo = root / "fifo.mp4"
    os.mkfifo(fifo)
    started = time.monotonic()
    r = post_path(server, fifo, timeout=10)
    assert r.status_code == 400 and "not a regular file" in r.json()["error"]["message"]
    assert time.monotonic() - started < 3
    (root / "to_dev.mp4").symlink_to("/dev/zero")
    assert post_path(server, root / "to_dev.mp4").status_code == 403
    (root / "fifo_list.m3u8").write_text(f"#EXTM3U\n#EXTINF:1,\n{fifo}\n")
    assert post_path(server, root / "fifo_list.m3u8").status_code == 400
    still_serves(server, root)


def test_a_nul_byte_in_the_path_is_a_clear_422(server):
    r = post(f"{server.url}/score", json={"task_text": TASK, "video_path": "/tmp/a\x00b.mp4"})
    assert r.status_code == 422 and "video_path" in r.json()["error"]["message"]
    assert "NUL" in r.json()["error"]["message"]


def test_dead_decode_workers_are_replaced_and_requests_still_served(server, root):
    replaced = server.service.pool.replaced
    for pid in server.service.pool.pids():
        os.kill(pid, signal.SIGKILL)  # what the OOM killer does
    time.sleep(0.2)
    for _ in range(3):
        still_serves(server, root)
    assert server.service.pool.replaced >= replaced + 1
    assert len(server.service.pool.pids()) == server.service.pool.size


# --- images of OpenAI chat requests (/v1/chat/completions) ---------------------------------------


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: (  # noqa: E731
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small real JPEG whose SOF0 header is rewritten to declare width x height."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(buf, format="JPEG")
    raw = bytearray(buf.getvalue())
    sof = raw.index(b"\xff\xc0")
    raw[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(raw)


HOSTILE = [
    ("http", "http://example.com/a.jpg", 400, "invalid_url", "does not fetch http"),
    ("https", "https://example.com/a.jpg", 400, "invalid_url", "does not fetch http"),
    ("ftp", "ftp://example.com/a.jpg", 400, "invalid_url", "unsupported URL"),
    ("no comma", "data:image/png;base64", 400, "invalid_image", "malformed data URL"),
    ("not base64 encoded", "data:image/png,rawbytes", 400, "invalid_image", "base64"),
    ("bad base64", "data:image/png;base64,@@@@", 400, "invalid_image", "not valid base64"),
    ("empty", "data:image/png;base64,", 400, "invalid_image", "no data"),
    ("wrong mime", data_url(b"hello", "text/plain"), 400, "invalid_image", "must hold an image"),
    ("gif", data_url(b"GIF89a" + b"\x00" * 64, "image/gif"), 400, "invalid_image", "JPEG, PNG, WebP"),
    ("svg", data_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml"), 400, "invalid_image", "JPEG"),
    (
        "truncated jpeg",
        data_url(bytes.fromhex("ffd8ffe000104a464946") + b"\x00" * 40, "image/jpeg"),
        400,
        "invalid_image",
        "readable",
    ),
    ("png bomb", data_url(png_declaring(60000, 60000), "image/png"), 413, "image_too_large", "60000x60000"),
    ("jpeg bomb", data_url(jpeg_declaring(60000, 60000), "image/jpeg"), 413, "image_too_large", "60000x60000"),
    ("aspect", data_url(png_bytes(np.zeros((1, 400, 3), np.uint8)), "image/png"), 400, "invalid_image", "aspect"),
    ("outside root", "file:///etc/hostname", 403, "path_not_allowed", "outside"),
    ("dot dot", "file:///tmp/../etc/hostname", 403, "path_not_allowed", "outside"),
    ("missing file", "file:///nonexistent/a.png", 403, "path_not_allowed", None),
    ("remote file host", "file://host/x.png", 400, "invalid_url", "local path"),
]


@pytest.mark.parametrize(("name", "url", "status", "code", "fragment"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_chat_images_are_clear_4xx_within_the_budget(server, name, url, status, code, fragment):
    started = time.monotonic()
    r = post(f"{server.url}{CHAT}", json=chat_body(image_part(jpeg_data_url(frame(0, 0), 70)), image_part(url)))
    err = openai_error(r, status, code)
    assert time.monotonic() - started < 10
    if fragment:
        assert fragment in err["message"], err
    assert err["param"] in (None, "messages[0].content[1].image_url.url"), err
    # the next request is answered
    assert post(f"{server.url}{CHAT}", json=chat_body(image_part(jpeg_data_url(frame(0, 1), 70)))).status_code == 200
    assert get(f"{server.url}/health").json()["status"] == "ok"


def test_too_many_chat_images_and_videos(server):
    parts = [image_part(jpeg_data_url(frame(9, t), 70)) for t in range(17)]
    err = openai_error(post(f"{server.url}{CHAT}", json=chat_body(*parts)), 400, "too_many_images")
    assert "--max-images-per-request" in err["message"]
    video = {"type": "video_url", "video_url": {"url": data_url(encode_mp4(episode_frames(4)), "video/mp4")}}
    openai_error(post(f"{server.url}{CHAT}", json=chat_body(video, video)), 400, "bad_request")
    not_video = {"type": "video_url", "video_url": {"url": data_url(b"\x00" * 64, "video/mp4")}}
    err = openai_error(post(f"{server.url}{CHAT}", json=chat_body(not_video)), 400, "invalid_video")
    assert err["param"] == "messages[0].content[0].video_url.url"


def test_decode_workers_survive_hostile_chat_images(server):
    replaced = server.service.pool.replaced
    for url in (
        data_url(png_declaring(60000, 60000), "image/png"),
        data_url(jpeg_declaring(40000, 40000), "image/jpeg"),
    ):
        openai_error(post(f"{server.url}{CHAT}", json=chat_body(image_part(url))), 413)
    assert server.service.pool.replaced - replaced <= 2  # a worker near its budget may be recycled, never killed by OOM
    frames = [image_part(jpeg_data_url(frame(1, t), 70)) for t in range(8)]
    assert post(f"{server.url}{CHAT}", json=chat_body(*frames)).status_code == 200


def test_chat_files_outside_the_root_fifos_and_links_never_block_or_leak(server, root, outside):
    fifo = root / "chat.fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    link = root / "chat-link.png"
    if not link.exists():
        link.symlink_to(outside)
    cases = [(outside, 403), (link, 403), (fifo, 400), (root / ".." / outside.parent.name / outside.name, 403)]
    for path, status in cases:
        started = time.monotonic()
        r = post(f"{server.url}{CHAT}", json=chat_body(image_part(f"file://{path}")))
        err = openai_error(r, status)
        assert time.monotonic() - started < 10
        assert path == outside or str(outside) not in err["message"]  # never where a link points
        assert err["param"] == "messages[0].content[0].image_url.url"
    still_serves(server, root)


# --- body size, decode memory and the JSON parser's needs, consistent ---------------------------


def declare_body(url: str, content_type: str, length: int) -> tuple[int, dict]:
    """Send only the head of a POST /score/batch declaring `length` bytes; the answer, if it comes
    before any body byte."""
    address = httpx.URL(url)
    with socket.create_connection((address.host, address.port), timeout=30) as sock:
        sock.sendall(
            f"POST /score/batch HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\n\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        length_left = int(
            next(v for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:]) if k.lower() == b"content-length")
        )
        while len(body) < length_left:
            body += sock.recv(65536)
    return status, json.loads(body)


def test_a_json_body_larger_than_a_worker_can_parse_is_a_413_naming_the_limits(server):
    """Defaults: a 384 MiB JSON batch is under --max-body-mb 512 but needs more than a decode
    worker's 4096 MiB to parse (before: read whole, then 422 "body is not valid JSON: Not enough
    memory..."). Now refused from its Content-Length, before a byte is read, naming both limits."""
    status, answer = declare_body(server.url, "application/json", 384 * 1024 * 1024)
    assert status == 413 and answer["error"]["type"] == "body_too_large", answer
    message = answer["error"]["message"]
    assert "--decode-memory-mb 4096" in message and "application/x-reward-batch" in message, message
    status, answer = declare_body(server.url, "application/json", 600 * 1024 * 1024)
    assert status == 413 and "--decode-memory-mb" in answer["error"]["message"], answer
