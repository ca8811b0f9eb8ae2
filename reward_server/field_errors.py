"""Errors that name the request field at fault (`param`, OpenAI's name for it: `messages[0].content`).

One base for every such error, whichever layer raises it (a body that fails validation, an image,
a path, a chat option): the `param` survives the decode worker's pipe, and the HTTP layer reads it
from here alone (`/v1` answers carry it, the server's own routes do not).
"""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound="FieldError")


class FieldError(Exception):
    """An error about one request field; `param` names it, or is None when no one field is at fault."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

    def __reduce__(self):  # keep `param` across the decode worker's pipe
        return (type(self), (str(self), self.param))

    def at(self: E, param: str | None) -> E:
        """The same error (same class, so the same status and message), naming `param`."""
        return type(self)(str(self), param)
