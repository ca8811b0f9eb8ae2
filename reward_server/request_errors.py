"""Errors about the request itself, whichever layer finds them: a field at fault, and a body that
cannot be read.

FieldError is the one base for errors that name the request field at fault (`param`, OpenAI's
name for it: `messages[0].content`), whichever layer raises them (a body that fails validation,
an image, a path, a chat option): the `param` survives the decode worker's pipe, and the HTTP
layer reads it from here alone (`/v1` answers carry it, the server's own routes do not). The
body's errors are raised where the body is read (http/body.py) and where a JSON body is parsed
(a decode worker); the error table (errors.py) names them all.
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


class BodyTooLarge(ValueError):
    """The body is larger than the server reads (--max-body-mb, or what a decode worker can parse)."""


class LengthRequired(ValueError):
    """A raw batch body without a Content-Length."""


class BodyTimeout(Exception):
    """The client stopped sending its body (408). Not a TimeoutError: handlers that turn the
    server's own timeouts into 504 must never see the client's stall as one."""


class BodyDeadline(Exception):
    """The client's own deadline (X-Reward-Deadline-S) passed while its body was still arriving:
    504 deadline_exceeded, retryable (a later attempt with a longer deadline can succeed), never
    the 408 of a body the server itself gave up on. The rest of the body is not read."""

    close_connection = True


class ClientGone(ConnectionError):
    """The client disconnected before its answer was ready."""


class BadRequest(FieldError, ValueError):
    """The request cannot be served as sent; the message says what to change."""
