"""A client that starts an upload and then all but stops: what a paused or starved env worker
looks like to the server (a declared Content-Length, or a chunked body, then a trickle).

Used by the fast tests and by `python -m reward_tools.stalled_uploads` (the measurement). Only
127.0.0.1 is ever contacted: callers pass a port, not a host.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field

from reward_protocol import raw_batch

HEAD_TEMPLATE = "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n{framing}\r\n"
# a raw batch's prefix announcing a 1 MiB header: the server then waits for the header's bytes
RAW_PREFIX = b"RWB1" + struct.pack("<I", 1 << 20)


@dataclass
class StalledUpload:
    """One connection sending a body very slowly. `declared`: the Content-Length it claims
    (None: chunked). A declared body is a raw batch to /score/batch (a JSON body is refused
    from its length above --decode-memory-mb / 16; a raw batch may use all of --max-body-mb), a
    chunked one JSON to /score. `tick()` sends one more byte; `answer()` reads what the server
    said."""

    port: int
    declared: int | None
    headers: dict[str, str] = field(default_factory=dict)  # more request headers (X-Reward-Deadline-S)
    sent: int = 0
    closed: bool = False
    status: int | None = None
    error_type: str | None = None
    message: str = ""
    retryable: bool | None = None
    _sock: socket.socket = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        extra = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
        if self.declared is None:
            framing = extra + "Transfer-Encoding: chunked\r\n"
            self._sock.sendall(HEAD_TEMPLATE.format(path="/score", ctype="application/json", framing=framing).encode())
            self.tick()  # the body has begun: '{'
        else:
            framing = f"{extra}Content-Length: {self.declared}\r\n"
            head = HEAD_TEMPLATE.format(path="/score/batch", ctype=raw_batch.CONTENT_TYPE, framing=framing)
            self._sock.sendall(head.encode() + RAW_PREFIX)
            self.sent = len(RAW_PREFIX)

    def tick(self) -> bool:
        """One more byte of body; False once the server has closed the connection or answered."""
        if self.closed:
            return False
        byte = b"{" if self.sent == 0 else b" "  # JSON; after a raw batch's prefix, its header
        data = byte if self.declared is not None else b"1\r\n" + byte + b"\r\n"
        try:
            self._sock.sendall(data)
        except OSError:
            self._finish()
            return False
        self.sent += 1
        if self._readable():
            self._finish()
            return False
        return True

    def _readable(self) -> bool:
        self._sock.setblocking(False)
        try:
            return bool(self._sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            self._sock.setblocking(True)

    def _finish(self) -> None:
        """Read the server's answer, if any, and close."""
        self.closed = True
        data = b""
        self._sock.settimeout(5)
        try:
            while chunk := self._sock.recv(65536):
                data += chunk
        except OSError:
            pass
        self._sock.close()
        head, _, body = data.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 "):
            self.status = int(head.split()[1])
            try:
                error = json.loads(body)["error"]
                self.error_type, self.message = error["type"], error["message"]
                self.retryable = error.get("retryable")
            except (ValueError, KeyError, TypeError):
                pass

    def answer(self, timeout_s: float) -> int | None:
        """Wait up to timeout_s for the server to answer (without sending more); its status."""
        if not self.closed:
            self._sock.settimeout(timeout_s)
            try:
                self._sock.recv(1, socket.MSG_PEEK)
            except OSError:
                pass
            self._finish()
        return self.status

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()
