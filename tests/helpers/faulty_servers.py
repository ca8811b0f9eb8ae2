"""A reward server that answers badly, for the client's tests: a real HTTP server on 127.0.0.1
(http.server, one thread per connection) whose /health and /score/batch each play one fault.

/health: `ok` (limits given by `limits`), `drip` (a byte every 0.5 s of a long answer).
/score and /score/batch: `ok` (every episode scored GOOD), `drip` (likewise), `huge` (an answer
of 300 MiB, sent until the client stops reading, with no Content-Length), `gzip_bomb` (0.5 MiB
of gzip inflating to 512 MiB), `body_timeout_once` (the first request: the server's 408
`body_timeout` after the client's X-Reward-Deadline-S, as the real server says it; then `ok`),
`slow` (`ok` after 0.15 s, counting how many requests are in progress at once).
"""

from __future__ import annotations

import json
import struct
import threading
import time
import zlib
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from reward_protocol import raw_batch
from tests.helpers.faulty import GOOD, response  # one right answer for every faulty server

HUGE_BYTES = 300 * 1024 * 1024
BOMB_BYTES = 512 * 1024 * 1024
DRIP_S = 0.5


@cache
def gzip_bomb() -> bytes:
    """A valid gzip stream of BOMB_BYTES zeros in about 0.5 MiB. Built from one 16 MiB block:
    after a sync flush every further block of zeros deflates to the same bytes (0.7 s, not the
    5 s of deflating 512 MiB)."""
    block = bytes(16 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = deflate.compress(block) + deflate.flush(zlib.Z_SYNC_FLUSH)
    repeat = deflate.compress(block) + deflate.flush(zlib.Z_SYNC_FLUSH)
    end = deflate.flush()
    crc = 0
    for _ in range(BOMB_BYTES // len(block)):
        crc = zlib.crc32(block, crc)
    count = BOMB_BYTES // len(block)
    trailer = struct.pack("<II", crc, BOMB_BYTES & 0xFFFFFFFF)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + first + repeat * (count - 1) + end + trailer


class _Handler(BaseHTTPRequestHandler):
    server: FaultyRewardServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        body = {"status": "ok", "backend": "faulty", "engine": "none", "model": "none"}
        if self.server.limits is not None:
            body["limits"] = self.server.limits
        self.server.answer(self, self.server.health, 200, body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["content-length"]))
        owner = self.server
        with owner.lock:
            owner.requests += 1
            first = owner.requests == 1
            owner.in_progress += 1
            self.in_progress = True
            owner.most_in_progress = max(owner.most_in_progress, owner.in_progress)
            owner.deadlines.append(float(self.headers.get("x-reward-deadline-s", "nan")))
        try:
            owner.post(self, data, first)
        finally:
            owner.release(self)


class FaultyRewardServer(ThreadingHTTPServer):
    """The server; `with` serves it in a thread until the block ends."""

    daemon_threads = True

    def __init__(self, health: str = "ok", score: str = "ok", limits: dict | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.health, self.score, self.limits = health, score, limits
        self.requests = 0  # POSTs
        self.in_progress = 0
        self.most_in_progress = 0
        self.deadlines: list[float] = []  # X-Reward-Deadline-S of each POST
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def post(self, handler: BaseHTTPRequestHandler, data: bytes, first: bool) -> None:
        if handler.path == "/score":
            self.answer(handler, self.score, 200, response(GOOD), first)
            return
        if handler.headers["content-type"] == raw_batch.CONTENT_TYPE:
            n = len(raw_batch.decode(data)[0].requests)
        else:
            n = len(json.loads(data)["requests"])
        results = [{"index": i, "response": response(GOOD)} for i in range(n)]
        self.answer(handler, self.score, 200, {"results": results}, first)

    def release(self, handler: BaseHTTPRequestHandler) -> None:
        """The request no longer counts as in progress (once). Called just before its answer's last
        bytes go out: once they have, the client may send its next request before this handler's
        thread runs again, and counting until then showed 17 requests of a client that holds 16."""
        with self.lock:
            if getattr(handler, "in_progress", False):
                handler.in_progress = False
                self.in_progress -= 1

    def answer(self, handler: BaseHTTPRequestHandler, fault: str, status: int, body: dict, first: bool = False) -> None:
        try:
            self._answer(handler, fault, status, body, first)
        except OSError:  # the client left (as it should, at its bound or its cap)
            pass

    def _answer(self, handler: BaseHTTPRequestHandler, fault: str, status: int, body: dict, first: bool) -> None:
        if fault == "body_timeout_once" and first:
            told = handler.headers.get("x-reward-deadline-s")
            message = f"the body did not arrive within {told} s (--request-timeout-s) (0 bytes received in 0 s)"
            status, body = 408, {"error": {"type": "body_timeout", "message": message, "retryable": False}}
        if fault == "slow":
            time.sleep(0.15)
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        if fault == "huge":  # no Content-Length: the body ends when the connection does
            handler.send_header("connection", "close")
            handler.end_headers()
            chunk = b" " * (1 << 20)
            for _ in range(HUGE_BYTES // len(chunk)):
                if self.stop.is_set():
                    return
                handler.wfile.write(chunk)
            return
        if fault == "gzip_bomb":
            bomb = gzip_bomb()
            handler.send_header("content-encoding", "gzip")
            handler.send_header("content-length", str(len(bomb)))
            handler.end_headers()
            handler.wfile.write(bomb)
            return
        if fault == "drip":
            data = data.ljust(10_000)  # JSON with trailing spaces: 5000 s at a byte per DRIP_S
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        if fault != "drip":
            self.release(handler)
            handler.wfile.write(data)
            return
        for k in range(len(data)):
            if self.stop.wait(DRIP_S):
                return
            handler.wfile.write(data[k : k + 1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> FaultyRewardServer:
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()  # ends drips and long answers
        self.shutdown()
        self.server_close()
