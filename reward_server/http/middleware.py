"""The one middleware: the API key check (every route but /health) and request counting by route and
status, as plain ASGI (Starlette's BaseHTTPMiddleware would wrap every body chunk and hide disconnects)."""

from __future__ import annotations

import hmac

from reward_server.core.service import RewardService
from reward_server.errors import Unauthorized
from reward_server.http.errors import error_response


class AuthAndMetrics:
    """Plain ASGI middleware: the API key check (all routes but /health) and request counting.
    (Starlette's BaseHTTPMiddleware would wrap every body chunk and hide disconnects.)"""

    def __init__(self, app, service: RewardService):
        self.app = app
        self.service = service
        key = service.settings.api_key
        self.expected = key.encode() if key else None

    def _authorized(self, scope) -> bool:
        if self.expected is None or scope["path"] == "/health":
            return True
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # the scheme is case-insensitive (RFC 7235); the token is compared in constant time
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.expected)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if not self._authorized(scope):
                raise Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
            await self.app(scope, receive, send_counted)
        except Exception as exc:  # anything unexpected: a 500 without internals, logged by classify
            await error_response(exc, scope.get("path", ""))(scope, receive, send_counted)
        route = scope.get("route")
        self.service.metrics.requests.labels(getattr(route, "path", "unmatched"), str(status["code"])).inc()
