"""Property-based fuzz of the inputs JSON Schema cannot describe, against the real app on
127.0.0.1 (the fake engine: what is fuzzed is parsing and bounds; tests/test_schema_fuzz.py
covers the JSON routes from their schema).

The raw batch body (b"RWB1" | header length | header JSON | frames):
Hypothesis builds a valid body and then breaks it the ways a hostile or buggy sender would:
random header fields, offsets and shapes, a header that is any JSON or any bytes, deep nesting,
a lying header length, a wrong magic, a cut-off or padded payload. Every answer must be 200 (each
item a response or its own error) or a 4xx with the product's error body, never a 5xx, and a
valid request is answered right after.

Chat requests (/v1/chat/completions): messages, roles and content parts of any shape, image and
video URLs that are valid, broken, remote or local, sampling fields with any value: 200 or a 4xx
in OpenAI's error body. Bounded: about 200 requests, seconds."""

from __future__ import annotations

import json
import os
import struct

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_protocol import raw_batch
from reward_protocol.score import ScoreOptions
from tests.helpers.servers import CHAT, InProcessServer, data_url, png_bytes

HEADERS = {"content-type": raw_batch.CONTENT_TYPE}
RAW_EXAMPLES = 120
CHAT_EXAMPLES = 80

# JSON values a header field may be replaced with: the types a schema does not expect included
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
sizes = st.one_of(st.integers(-3, 64), st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, 3, 2**31, 2**32 + 1]))
FIELDS = ["offset", "shape", "nframes", "max_pixels", "task_text", "frames", "video_path", "backend_kwargs", "extra"]


@st.composite
def bodies(draw) -> tuple[bytes, str]:
    """A raw batch body and a note of what was done to it (shown when an example fails)."""
    episodes = []
    for _ in range(draw(st.integers(1, 3))):
        shape = (draw(st.integers(1, 3)), draw(st.integers(1, 24)), draw(st.integers(1, 24)), 3)
        episodes.append((ScoreOptions(task_text="t"), np.full(shape, draw(st.integers(0, 255)), np.uint8)))
    parts = raw_batch.encode(episodes).parts
    header = json.loads(parts[1])
    payload = b"".join(bytes(p) for p in parts[2:])
    how = draw(st.sampled_from(["valid", "field", "shape", "offset", "any json", "any bytes", "deep", "many"]))
    items = header["requests"]
    index = draw(st.integers(0, len(items) - 1))
    if how == "field":
        field = draw(st.sampled_from(FIELDS))
        target = items[index]["frames"] if field in ("offset", "shape") else items[index]
        target[field] = draw(json_values)
    elif how == "shape":
        items[index]["frames"]["shape"] = draw(st.lists(sizes, min_size=0, max_size=6))
    elif how == "offset":
        items[index]["frames"]["offset"] = draw(sizes)
    elif how == "many":  # up to past the batch limit, all naming the same frames
        header["requests"] = items[:1] * draw(st.sampled_from([2, 64, 1000, 1025, 2000]))
    text = json.dumps(header).encode()
    if how == "any json":
        text = json.dumps(draw(json_values)).encode()
    elif how == "any bytes":
        text = draw(st.binary(max_size=64))
    elif how == "deep":
        depth = draw(st.sampled_from([64, 65, 1000, 100_000]))
        text = b'{"requests":' + b"[" * depth + b"]" * depth + b"}"
    length = len(text)
    if draw(st.integers(0, 9)) == 0:  # a header length that lies
        length = draw(st.one_of(st.integers(0, len(text) + 8), st.integers(0, 2**32 - 1)))
    magic = raw_batch.MAGIC if draw(st.integers(0, 19)) else draw(st.binary(min_size=0, max_size=4))
    body = magic + struct.pack("<I", length) + text + payload
    cut = draw(st.integers(0, 9))
    if cut == 0:  # cut off anywhere (Content-Length says so: the body is complete but short)
        body = body[: draw(st.integers(0, len(body)))]
    elif cut == 1:  # padded past what the header names
        body += draw(st.binary(min_size=1, max_size=32))
    return body, f"{how}, header length {length} of {len(text)}, body {len(body)} bytes"


def valid_body() -> bytes:
    return raw_batch.encode([(ScoreOptions(task_text="t"), np.zeros((2, 8, 8, 3), np.uint8))]).tobytes()


def check(r: httpx.Response, note: str) -> None:
    assert r.status_code == 200 or 400 <= r.status_code < 500, (note, r.status_code, r.text[:300])
    answer = r.json()
    if r.status_code != 200:
        error = answer["error"]
        assert isinstance(error["type"], str) and error["type"] and error["message"], (note, answer)
        return
    for result in answer["results"]:
        assert (result["response"] is None) != (result["error"] is None), (note, result)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with InProcessServer(video_roots=[str(tmp_path_factory.mktemp("videos"))]) as s:
        yield s


def test_raw_batch_bodies_never_fail_the_server(server):
    seen: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=60, headers=HEADERS) as client:

        @given(case=bodies())
        @settings(max_examples=RAW_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case: tuple[bytes, str]) -> None:
            body, note = case
            r = client.post("/score/batch", content=body)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            check(r, note)
            if sum(seen.values()) % 25 == 0:  # and the server still serves
                assert client.post("/score/batch", content=valid_body()).status_code == 200

        run()
        r = client.post("/score/batch", content=valid_body())
        assert r.status_code == 200 and r.json()["results"][0]["response"] is not None, r.text
    print(f"\nraw batch fuzz: {sum(seen.values())} bodies, answers {dict(sorted(seen.items()))}")
    assert seen.get(200) and seen.get(422), seen  # both sides of the format were reached
    assert server.service.admission.bytes == 0 and server.service.admission.episodes == 0


# --- chat --------------------------------------------------------------------------------------

PNG = data_url(png_bytes(np.full((16, 16, 3), 200, np.uint8)), "image/png")
urls = st.one_of(
    st.just(PNG),
    st.binary(max_size=64).map(lambda b: data_url(b, "image/png")),
    st.sampled_from(["data:image/png;base64,!!!", "data:,", "data:image/png;base64,", "http://127.0.0.1:9/x.png"]),
    st.sampled_from(["file:///etc/passwd", "/etc/passwd", "", "data:video/mp4;base64,AAAA"]),
    st.text(max_size=40),
)
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": urls})}),
    st.fixed_dictionaries({"type": st.just("video_url"), "video_url": st.fixed_dictionaries({"url": urls})}),
    st.fixed_dictionaries({"type": st.text(max_size=10)}),
    json_values,
)
messages = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), json_values),
        "content": st.one_of(st.text(max_size=40), st.lists(parts, max_size=3), json_values),
    }
)
SAMPLING = [
    "model",
    "max_tokens",
    "temperature",
    "n",
    "stream",
    "logprobs",
    "top_logprobs",
    "stop",
    "seed",
    "response_format",
    "allowed_token_ids",
    "top_k",
    "max_completion_tokens",
]


@st.composite
def chat_bodies(draw) -> dict:
    body = {"messages": draw(st.one_of(st.lists(messages, min_size=1, max_size=3), json_values))}
    for field in draw(st.lists(st.sampled_from(SAMPLING), max_size=3, unique=True)):
        body[field] = draw(json_values)
    return body


def test_chat_requests_never_fail_the_server(server):
    seen: dict[int, int] = {}
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @given(body=chat_bodies())
        @settings(max_examples=CHAT_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(body: dict) -> None:
            r = client.post(CHAT, json=body)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code == 200 or 400 <= r.status_code < 500, (body, r.status_code, r.text[:300])
            if r.status_code == 200:
                assert r.json()["choices"], r.text
                return
            answer = r.json()
            assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}, answer
            assert answer["error"]["message"] and answer["error"]["code"], answer

        run()
        good = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]}
        assert client.post(CHAT, json=good).status_code == 200
    print(f"\nchat fuzz: {sum(seen.values())} requests, answers {dict(sorted(seen.items()))}")
    assert seen.get(200) and (seen.get(400) or seen.get(422)), seen


# --- file URLs and paths, on every route that reads a server-local file -------------------------
#
# Every route that names a file goes through reward_server/media/paths.py. Hypothesis builds
# paths and file:// URLs from pieces that break URL and path functions (NUL, percent-encoded
# NUL or non-UTF-8, '..', query and fragment marks, hosts, IPv6 brackets, over-long names) and
# from pieces that escape the root (a symlinked file or directory pointing outside, '..' up
# to a secret directory, the secret's own path). Outside the root sit a bright video and image
# and a text file holding a marker: the fake engine scores brightness, so a read of the secret
# media would answer ~100; every answer must instead be 4xx (or 200 from a dark file inside
# the root), never a 5xx, and no answer ever holds the marker.

# FUZZ_PATH_EXAMPLES=1000 searches deeper by hand (5 routes x 1000: ~25 s); CI draws 60 per route
PATH_EXAMPLES = int(os.environ.get("FUZZ_PATH_EXAMPLES", "60"))
MARKER = "SECRET-7f3a91"
PIECES = [
    "ok.mp4", "ok.png", "link-out.mp4", "link-out.png", "link-dir", "secret.mp4", "secret.png", "secret.txt",
    "..", ".", "", "%2e%2e", "%2F", "%00", "\x00", "%ED%A0%80", "%", "%zz", "%25", "?x", "#f", "?", "#",
    "a" * 300, " ", "\\", "~", "[::1", "%0A", "\n", "\ud800", "fifo", "dir",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from PIL import Image

    from reward_client.video_io import write_mp4

    base = tmp_path_factory.mktemp("world")
    root, secret = base / "root", base / "secret"
    root.mkdir()
    secret.mkdir()
    dark, bright = np.full((4, 32, 32, 3), 30, np.uint8), np.full((4, 32, 32, 3), 255, np.uint8)
    write_mp4(dark, root / "ok.mp4")
    Image.fromarray(dark[0]).save(root / "ok.png")
    write_mp4(bright, secret / "secret.mp4")
    Image.fromarray(bright[0]).save(secret / "secret.png")
    (secret / "secret.txt").write_text(MARKER)
    (root / "link-out.mp4").symlink_to(secret / "secret.mp4")
    (root / "link-out.png").symlink_to(secret / "secret.png")
    (root / "link-dir").symlink_to(secret)
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    return {"root": root, "secret": secret}


@pytest.fixture(scope="module")
def confined(world):
    with InProcessServer(video_roots=[str(world["root"])]) as s:
        yield s


@st.composite
def local_paths(draw, world: dict) -> str:
    base = draw(st.sampled_from([str(world["root"]), str(world["secret"]), str(world["root"].parent), "", "/", "x"]))
    pieces = draw(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), min_size=1, max_size=5))
    path = "/".join([base, *pieces])
    return path if draw(st.integers(0, 9)) else draw(st.text(max_size=40))


@st.composite
def file_urls(draw, world: dict) -> str:
    from urllib.parse import quote

    path = draw(local_paths(world))
    if draw(st.booleans()):
        path = quote(path, safe="/%?#", errors="surrogatepass")
    prefix = draw(
        st.sampled_from(["file://", "file:", "FILE://", "file://localhost", "file://host", "file:///", "file://["])
    )
    return prefix + path


ROUTES = ["score", "batch", "raw", "chat image", "chat video"]


def _post_json(client: httpx.Client, path: str, body: dict) -> httpx.Response:
    # json.dumps escapes a lone surrogate (httpx would fail to encode it): the server must refuse it
    return client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def _path_request(client: httpx.Client, route: str, text: str) -> httpx.Response:
    if route == "score":
        return _post_json(client, "/score", {"task_text": "t", "video_path": text})
    if route == "batch":
        return _post_json(client, "/score/batch", {"requests": [{"task_text": "t", "video_path": text}]})
    if route == "raw":
        body = raw_batch.encode([(ScoreOptions(task_text="t"), text)]).tobytes()
        return client.post("/score/batch", content=body, headers=HEADERS)
    kind = "image" if route == "chat image" else "video"
    part = {"type": f"{kind}_url", f"{kind}_url": {"url": text}}
    return _post_json(client, CHAT, {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "t"}]}]})


def _check_confined(route: str, text: str, r: httpx.Response) -> str:
    """The answer's kind ('read' for a dark file inside the root, else the error type)."""
    note = (route, text[:200], r.status_code, r.text[:300])
    assert r.status_code == 200 or 400 <= r.status_code < 500, note
    assert MARKER not in r.text, note
    answer = r.json()
    if r.status_code != 200:
        error = answer["error"]
        assert error["message"] and (error.get("code") or error.get("type")), note
        return error.get("code") or error["type"]
    if route.startswith("chat"):
        assert int(answer["choices"][0]["message"]["content"]) < 50, note  # a dark file: inside the root
        return "read"
    results = answer["results"] if "results" in answer else [{"response": answer, "error": None}]
    item = results[0]
    if item["error"] is not None:
        assert item["error"]["type"] != "internal_error", note
        return item["error"]["type"]
    assert item["response"]["score"] < 0.5, note  # a dark file: inside the root
    return "read"


@pytest.mark.parametrize("route", ROUTES)
def test_file_urls_and_paths_are_4xx_and_never_read_outside_the_root(confined, world, route):
    seen: dict[str, int] = {}
    strategy = file_urls(world) if route.startswith("chat") else st.one_of(local_paths(world), file_urls(world))
    with httpx.Client(base_url=confined.url, timeout=60) as client:

        @given(text=strategy)
        @settings(max_examples=PATH_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(text: str) -> None:
            kind = _check_confined(route, text, _path_request(client, route, text))
            seen[kind] = seen.get(kind, 0) + 1

        run()
        # the named escapes, whatever Hypothesis drew: each refused, the secret never read
        root, secret = world["root"], world["secret"]
        for path in (f"{root}/link-out.mp4", f"{root}/link-out.png", f"{root}/link-dir/secret.mp4",
                     f"{root}/../secret/secret.png", f"{secret}/secret.txt", f"{root}/ok.png%00.jpg"):  # fmt: skip
            text = f"file://{path}" if route.startswith("chat") else path
            kind = _check_confined(route, text, _path_request(client, route, text))
            assert kind in ("path_not_allowed", "invalid_path", "file_not_found", "invalid_request"), (path, kind)
        good = f"{root}/ok.png" if route == "chat image" else f"{root}/ok.mp4"
        assert (
            _check_confined(
                route, good, _path_request(client, route, f"file://{good}" if route.startswith("chat") else good)
            )
            == "read"
        )
    print(f"\n{route}: {sum(seen.values())} paths/URLs, answers {dict(sorted(seen.items()))}")
    assert len(seen) > 1, seen
