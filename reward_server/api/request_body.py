"""What a dialect needs from a request body: its declared length and its bytes as they arrive.
The transport (http/body.py's BodyReader) provides it; the dialects depend on this contract, not
on the transport, so the layers stay one-way (http -> api -> core)."""

from __future__ import annotations

from typing import Protocol


class RequestBody(Protocol):
    length: int | None  # Content-Length, or None for a chunked body

    async def wait_for(self, nbytes: int) -> memoryview:
        """The first nbytes of the body, once they have arrived."""
        ...

    async def read_all(self) -> memoryview:
        """The whole body, once it has arrived."""
        ...
