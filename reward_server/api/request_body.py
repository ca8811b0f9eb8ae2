"""What a dialect needs from the transport: a request's body as it arrives, and the intake that
checks, admits and reads it while the dialect's work runs. The transport (http/intake.py,
http/body.py) provides both; the dialects depend on this contract, not on the transport, so the
layers stay one-way (http -> api -> core)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from fastapi import Request

from reward_server.core.deadline import Deadline

T = TypeVar("T")


class RequestBody(Protocol):
    length: int | None  # Content-Length, or None for a chunked body

    async def wait_for(self, nbytes: int) -> memoryview:
        """The first nbytes of the body, once they have arrived."""
        ...

    async def read_all(self) -> memoryview:
        """The whole body, once it has arrived."""
        ...


# A dialect's work on one request: its body as it arrives, its deadline, its content type.
Work = Callable[[RequestBody, Deadline, str], Awaitable[T]]


class Intake(Protocol):
    async def __call__(self, request: Request, allowed: tuple[str, ...], work: Work) -> object:
        """Check the content type and size, admit the body, run `work` while the body is read,
        cancel it if the client leaves; `work`'s answer once the whole body has arrived."""
        ...
