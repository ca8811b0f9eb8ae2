"""What a real server process answers on a raw socket when the connection itself is wrong: a body
shorter than its Content-Length (never scored on partial data), a request head too slow or too
large, too many connections. Every refusal carries the product's JSON error body."""

from __future__ import annotations

import json
import socket
import time

import pytest

from reward_protocol import raw_batch
from reward_protocol.score import ScoreOptions
from reward_tools.launch import ServerProcess
from tests.helpers.episodes import episode_frames, inline
from tests.helpers.servers import post

BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    flags = ["--engine", "fake", "--decode-workers", "1", "--body-timeout-s", str(BODY_TIMEOUT_S)]
    flags += ["--header-timeout-s", "3", "--max-header-kb", "8", "--max-connections", str(MAX_CONNECTIONS)]
    log = tmp_path_factory.mktemp("log") / "server.log"
    with ServerProcess(flags, log_path=log) as s:
        s.wait_ready(120)
        yield s


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(10)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict, bytes]:
    """Status, headers and body of one HTTP/1.1 answer (b"" body and status 0 if the server closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def raw_request(content: bytes, declared: int) -> bytes:
    head = (
        f"POST /score/batch HTTP/1.1\r\nHost: x\r\nContent-Type: {raw_batch.CONTENT_TYPE}\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    return head.encode() + content


def one_episode() -> bytes:
    return raw_batch.encode([(ScoreOptions(task_text="t"), episode_frames(4))]).tobytes()


def assert_served(server) -> None:
    r = post(f"{server.url}/score/batch", content=one_episode(), headers={"content-type": raw_batch.CONTENT_TYPE})
    assert r.status_code == 200 and "response" in r.json()["results"][0], r.text


def test_a_body_shorter_than_its_length_is_never_scored(server):
    """The last 100 bytes of the frames never arrive: the answer waits for them, then is 408
    body_timeout (the server must not score what may be a cut-off upload). A length declaring
    100 bytes past every frames region is refused at once, from the header (issue 58: bytes no
    region names are a wrong length, whatever their count)."""
    content = one_episode()
    sock = connect(server)
    started = time.monotonic()
    sock.sendall(raw_request(content, len(content))[:-100])
    status, headers, body = read_answer(sock)
    waited = time.monotonic() - started
    assert status == 408 and headers["content-type"] == "application/json", (status, body)
    error = json.loads(body)["error"]
    assert error["type"] == "body_timeout" and f"{len(content) - 100} bytes received" in error["message"], error
    assert BODY_TIMEOUT_S * 0.9 <= waited < BODY_TIMEOUT_S + 5, waited
    sock.close()
    sock = connect(server)
    sock.sendall(raw_request(content, len(content) + 100))
    status, _, body = read_answer(sock)
    assert status == 422 and b"100 bytes no frames region names" in body, (status, body)
    sock.close()
    assert_served(server)


def test_a_body_cut_off_by_the_client_closing_is_never_scored(server):
    content = one_episode()
    sock = connect(server)
    sock.sendall(raw_request(content, len(content) + 100))
    sock.shutdown(socket.SHUT_WR)  # the upload ends early: the server sees the connection end
    status, _, body = read_answer(sock)
    assert status != 200, body
    sock.close()
    assert_served(server)


def test_extra_bytes_after_what_the_header_names_are_refused_and_nothing_is_scored(server):
    """Padding the header does not name, sent whole: a wrong length, refused like any other
    (issue 58; before, padding was ignored unless it made 2x/4x/8x the frames' bytes)."""
    content = one_episode() + b"\0" * 100
    sock = connect(server)
    sock.sendall(raw_request(content, len(content)))
    status, _, body = read_answer(sock)
    assert status == 422 and b"100 bytes no frames region names" in body, body
    sock.close()
    assert_served(server)


def test_connection_refusals_carry_the_error_body(server):
    big = connect(server)
    big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 16384 + b"\r\n\r\n")
    status, headers, body = read_answer(big)
    assert status == 431 and headers["content-type"] == "application/json", body
    assert json.loads(body)["error"]["type"] == "request_head_too_large"
    big.close()

    slow = connect(server)
    slow.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    status, _, body = read_answer(slow)
    assert status == 408 and json.loads(body)["error"]["type"] == "header_timeout", body
    slow.close()

    # idle connections hold no request slot: with more of them open than the limit, every route
    # still answers (before: /health answered 503 until the idle sockets timed out)
    idle = [connect(server) for _ in range(MAX_CONNECTIONS + 4)]
    time.sleep(0.2)
    health = connect(server)
    health.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = read_answer(health)
    assert status == 200 and json.loads(body)["status"] == "ok", (status, body)
    health.close()
    assert_served(server)
    for sock in idle:
        sock.close()


BURST = 3 * MAX_CONNECTIONS
HELD_S = 4.0  # each served request is held this long by the engine, so the burst meets a full server


def burst_request(path: str, payload: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def test_a_burst_over_the_limit_is_served_up_to_it_and_health_still_answers(tmp_path):
    """3x --max-connections requests at once: the first ones are served, the rest get 503 +
    Retry-After in the product's error body (before: a burst over the limit was refused whole,
    every connection counted against it); /health answers during the burst from its reserve;
    the refusals are logged as a bounded number of lines, not one per connection."""
    flags = ["--engine", "fake", "--decode-workers", "1", "--max-connections", str(MAX_CONNECTIONS)]
    flags += ["--engine-option", f"delay_ms={int(HELD_S * 1000)}"]
    log = tmp_path / "server.log"
    body = json.dumps({"task_text": "t", "frames": inline(episode_frames(2, size=16))}).encode()
    with ServerProcess(flags, log_path=log) as s:
        s.wait_ready(120)
        socks = [connect(s) for _ in range(BURST)]
        for sock in socks:
            sock.sendall(burst_request("/score", body))
        health = connect(s)
        health.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, answer = read_answer(health)
        assert status == 200 and json.loads(answer)["status"] == "ok", (status, answer)
        health.close()
        codes: dict[int, int] = {}
        for sock in socks:
            sock.settimeout(60)
            status, headers, answer = read_answer(sock)
            codes[status] = codes.get(status, 0) + 1
            if status == 503:
                assert headers.get("retry-after") == "1", headers
                error = json.loads(answer)["error"]
                assert error["type"] == "overloaded" and "--max-connections" in error["message"], error
            else:
                assert status == 200 and json.loads(answer)["score"] is not None, (status, answer)
            sock.close()
        assert set(codes) == {200, 503}, codes
        assert codes[200] >= MAX_CONNECTIONS and codes[200] + codes[503] == BURST, codes
        assert_served(s)
    refusal_lines = [line for line in log.read_text().splitlines() if "--max-connections" in line]
    assert 1 <= len(refusal_lines) <= 2, refusal_lines  # one at once, then at most one summary
