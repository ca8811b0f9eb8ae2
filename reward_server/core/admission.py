"""Admission control: how much work the server holds at once, by episodes and by bytes.

Work beyond either bound is refused at once with 503 + Retry-After (the client backs off and
retries) instead of queueing without bound. Body bytes are admitted as they arrive, never as
declared (http/body.py): a body whose Content-Length alone exceeds the limit is refused before it is
read, and one whose arrived bytes would push the total past it is refused then and gives its
bytes back, so uploads that stall hold only what they sent and never lock others out; engine
work (episodes and chat requests) is admitted when a body has been parsed and is held until its
answer is sent, so a client that leaves or times out frees its share as soon as its work is
aborted. `--max-queue` bounds episodes and chat requests together (each is engine work of its
own), but they are counted apart, so the metrics and the refusal say which is which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WorkKind = Literal["episodes", "chat"]


class Overloaded(RuntimeError):
    """More work is in the server than it admits; retry later."""


class BodyOverloaded(Overloaded):
    """Refused mid-body: the rest of the body is not read, so the connection closes."""

    close_connection = True


class TooMuchForServer(ValueError):
    """One request alone exceeds what this server ever admits; sending it again cannot help."""


@dataclass
class Admission:
    max_work: int  # --max-queue: episodes and chat requests in progress at once
    max_bytes: int
    episodes: int = 0
    chat: int = 0  # chat requests in progress
    bytes: int = 0

    def check_declared(self, n: int) -> None:
        """A body that alone exceeds the limit is refused before any byte is read; a declared
        length takes nothing (a client can declare what it never sends)."""
        if n > self.max_bytes:
            raise TooMuchForServer(
                f"a body of {n} bytes exceeds what this server holds at once "
                f"({self.max_bytes} bytes, --max-inflight-mb)"
            )

    def take_arrived(self, n: int, held: int) -> None:
        """n more bytes of a body that already holds `held` have arrived."""
        self.check_declared(held + n)
        if self.bytes + n > self.max_bytes:
            raise BodyOverloaded(
                f"{self.bytes} bytes of request bodies are in progress; this body's {held + n} would exceed "
                f"the limit of {self.max_bytes} (--max-inflight-mb)"
            )
        self.bytes += n

    def give_bytes(self, n: int) -> None:
        self.bytes -= n

    def take(self, kind: WorkKind, n: int) -> None:
        what = "episodes in one request" if kind == "episodes" else "chat requests"
        if n > self.max_work:
            raise TooMuchForServer(f"{n} {what} exceed --max-queue {self.max_work}")
        if self.episodes + self.chat + n > self.max_work:
            raise Overloaded(
                f"{self.episodes} episodes and {self.chat} chat requests are already in progress "
                f"(--max-queue {self.max_work} bounds them together)"
            )
        setattr(self, kind, getattr(self, kind) + n)

    def give(self, kind: WorkKind, n: int) -> None:
        setattr(self, kind, getattr(self, kind) - n)
