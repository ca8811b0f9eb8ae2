"""What the reward client raises: one base class, and the three ways a call can fail."""

from __future__ import annotations


class RewardClientError(RuntimeError):
    """Base class of everything this client raises."""


class RewardRequestError(RewardClientError):
    """The server refused the request as sent (4xx); retrying cannot help."""

    def __init__(self, status: int, error_type: str, message: str):
        super().__init__(f"reward server refused the request ({status} {error_type}): {message}")
        self.status = status
        self.error_type = error_type


class RewardServerError(RewardClientError):
    """The server failed (500) or answered something that is not the documented schema."""


class RewardProtocolError(RewardServerError):
    """An answer that cannot be right (a faulty server or proxy): not the schema, not one item
    per episode, a score outside [0, 1]. Counted and retried; raised only inside the client."""


class RewardUnavailable(RewardClientError):
    """No usable answer before the deadline: server down, overloaded, too slow, or answering wrongly."""
