"""Malformed and invalid requests on the fast tier (the real app and decode workers; the fake
engine, since none of these reach a model): each is refused with the status, type and a
message a person can act on, and the server stays healthy."""

from __future__ import annotations

import httpx
import pytest

from reward_client.video_io import encode_mp4, write_mp4
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import InProcessServer

TASK = "put the black bowl on the plate"


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    (root / "not_a_video.mp4").write_bytes(b"definitely not a video")
    good = encode_mp4(episode_frames(20))
    (root / "truncated.mp4").write_bytes(good[: len(good) // 3])
    (root / "empty.mp4").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def server(bad_files):
    with InProcessServer(video_roots=[str(bad_files)]) as s:
        yield s


def test_body_limit_and_api_key(bad_files):
    with InProcessServer(video_roots=[str(bad_files)], api_key="s3cret", max_body_mb=1) as s:
        assert httpx.get(f"{s.url}/health").status_code == 200  # health stays open for supervisors
        r = httpx.post(f"{s.url}/score", json=frames_body())
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = httpx.get(f"{s.url}/metrics", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "s3cret" not in r.text
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{s.url}/score", json=frames_body(), headers=auth, timeout=60).status_code == 200
        big = {"task_text": TASK, "frames": inline(episode_frames(40, size=128))}  # ~2.6 MB of JSON
        r = httpx.post(f"{s.url}/score", json=big, headers=auth, timeout=60)
        assert r.status_code == 413 and "--max-body-mb" in r.json()["error"]["message"]


def frames_body(**extra) -> dict:
    return {"task_text": TASK, "frames": inline(episode_frames(8)), **extra}


BAD_INPUTS = [
    # (name, body or raw, headers, status, error type, fragment of the message)
    (
        "missing video_path",
        {"task_text": TASK, "video_path": "{dir}/nope.mp4"},
        None,
        400,
        "file_not_found",
        "does not exist",
    ),
    (
        "not a video",
        {"task_text": TASK, "video_path": "{dir}/not_a_video.mp4"},
        None,
        400,
        "invalid_video",
        "not a video container this server reads",
    ),
    ("truncated mp4", {"task_text": TASK, "video_path": "{dir}/truncated.mp4"}, None, 400, "invalid_video", "video"),
    ("empty file", {"task_text": TASK, "video_path": "{dir}/empty.mp4"}, None, 400, "invalid_video", "video"),
    ("outside roots", {"task_text": TASK, "video_path": "/etc/passwd"}, None, 403, "path_not_allowed", "outside"),
    (
        "dotdot escape",
        {"task_text": TASK, "video_path": "{dir}/../../etc/passwd"},
        None,
        403,
        "path_not_allowed",
        "outside",
    ),
    (
        "zero frames",
        {"task_text": TASK, "frames": {"shape": [0, 8, 8, 3], "data_b64": ""}},
        None,
        422,
        "invalid_request",
        "positive",
    ),
    ("huge nframes", frames_body(nframes=100000), None, 422, "invalid_request", "nframes"),
    ("tiny max_pixels", frames_body(max_pixels=10), None, 422, "invalid_request", "max_pixels"),
    ("empty task", {"task_text": "", "frames": inline(episode_frames(4))}, None, 422, "invalid_request", "task_text"),
    (
        "enormous task",
        {"task_text": "x" * 100000, "frames": inline(episode_frames(4))},
        None,
        422,
        "invalid_request",
        "task_text",
    ),
    ("unknown backend", frames_body(backend="gpt-4o"), None, 400, "unknown_backend", "known backends"),
    ("unknown kwarg", frames_body(backend_kwargs={"temprature": 0.2}), None, 422, "invalid_request", "temprature"),
    (
        "wrong kwarg type",
        frames_body(backend_kwargs={"max_tokens": "many"}),
        None,
        422,
        "invalid_request",
        "max_tokens",
    ),
    (
        "unknown score_mode",
        frames_body(backend_kwargs={"score_mode": "binary"}),
        None,
        422,
        "invalid_request",
        "score_mode",
    ),
    ("two sources", frames_body(video_path="/tmp/x.mp4"), None, 422, "invalid_request", "exactly one"),
    ("bad base64", {"task_text": TASK, "video_b64": "!!!notbase64"}, None, 400, "invalid_video", "base64"),
    (
        "frames size lie",
        {"task_text": TASK, "frames": {"shape": [4, 64, 64, 3], "data_b64": "AAAA"}},
        None,
        422,
        "invalid_request",
        "needs",
    ),
    ("malformed json", b'{"task_text": "x", ', {"content-type": "application/json"}, 422, "invalid_request", "JSON"),
    ("nul in path", {"task_text": TASK, "video_path": "/tmp/a\x00.mp4"}, None, 422, "invalid_request", "NUL"),
    (
        "wrong content type",
        b"task_text=x",
        {"content-type": "application/x-www-form-urlencoded"},
        415,
        "unsupported_media_type",
        "application/json",
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "headers", "status", "kind", "fragment"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_refused_clearly_and_the_server_stays_healthy(
    server, bad_files, name, body, headers, status, kind, fragment
):
    url = f"{server.url}/score"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers=headers, timeout=60)
    else:
        if "video_path" in body:
            body = {**body, "video_path": body["video_path"].replace("{dir}", str(bad_files))}
        r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == kind and fragment.lower() in error["message"].lower(), error
    assert "Traceback" not in r.text and str(bad_files.parent.parent) not in error["message"].replace(
        str(bad_files), ""
    )
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def test_batch_limits_and_one_bad_item(server, bad_files):
    r = httpx.post(f"{server.url}/score/batch", json={"requests": []}, timeout=60)
    assert r.status_code == 422 and "requests" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/score/batch", json={"requests": [frames_body()] * 300}, timeout=60)
    assert r.status_code == 422 and "256" in r.json()["error"]["message"]
    good = write_mp4(episode_frames(12), bad_files / "good.mp4")
    body = {
        "requests": [
            {"task_text": TASK, "video_path": str(good)},
            {"task_text": TASK, "video_path": str(bad_files / "not_a_video.mp4")},
            frames_body(),
        ]
    }
    results = httpx.post(f"{server.url}/score/batch", json=body, timeout=120).json()["results"]
    assert results[0]["response"] and results[2]["response"]
    assert results[1]["error"]["type"] == "invalid_video" and results[1]["response"] is None
