"""Admission control: how much work the server holds at once, by episodes and by bytes.

Work beyond either bound is refused at once with 503 + Retry-After (the client backs off and
retries) instead of queueing without bound. Bytes are admitted from Content-Length before a
body is read, so a flood of large bodies is turned away before it takes memory; episodes are
admitted when a body has been parsed and are held until their answers are sent, so a client
that leaves or times out frees its share as soon as its work is aborted.
"""

from __future__ import annotations

from dataclasses import dataclass


class Overloaded(RuntimeError):
    """More work is in the server than it admits; retry later."""


class TooMuchForServer(ValueError):
    """One request alone exceeds what this server ever admits; sending it again cannot help."""


@dataclass
class Admission:
    max_episodes: int
    max_bytes: int
    episodes: int = 0
    bytes: int = 0

    def take_bytes(self, n: int) -> None:
        if n > self.max_bytes:
            raise TooMuchForServer(
                f"a body of {n} bytes exceeds what this server holds at once "
                f"({self.max_bytes} bytes, --max-inflight-mb)"
            )
        if self.bytes + n > self.max_bytes:
            raise Overloaded(
                f"{self.bytes} bytes of request bodies are in progress; another {n} would exceed "
                f"the limit of {self.max_bytes} (--max-inflight-mb)"
            )
        self.bytes += n

    def give_bytes(self, n: int) -> None:
        self.bytes -= n

    def take_episodes(self, n: int) -> None:
        if n > self.max_episodes:
            raise TooMuchForServer(f"{n} episodes in one request exceed --max-queue {self.max_episodes}")
        if self.episodes + n > self.max_episodes:
            raise Overloaded(f"{self.episodes} episodes are already in progress (limit {self.max_episodes})")
        self.episodes += n

    def give_episodes(self, n: int) -> None:
        self.episodes -= n
