"""The HTTP server process: connection guards, drain on SIGTERM, and a bounded exit.

- A connection must deliver its request head within `--header-timeout-s` and in at most
  `--max-header-kb` (431 above): slow or endless heads cannot hold connections open. Idle
  keep-alive connections close after 5 s (uvicorn), bodies that stall after `--body-timeout-s`
  (body.py). Up to `--max-connections` requests are served at once, the rest answered 503 +
  Retry-After (refusals logged at a bounded rate); /health and other GETs keep a reserve.
- On SIGTERM / SIGINT: /health answers 503 `draining`, new work gets 503, work in progress
  finishes (up to `--shutdown-timeout-s`), then the server stops. Whatever hangs after that
  (an engine that does not shut down), the process is gone within the timeout plus a grace.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from reward_protocol.score import RETRYABLE_STATUSES, ItemError
from reward_server.errors import BY_TYPE, RETRY_AFTER_S, render_error

logger = logging.getLogger(__name__)

_PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
EXIT_GRACE_S = 15.0  # after the drain: engine shutdown, closing connections


PROBE_RESERVE = 16  # requests beyond --max-connections kept for bodiless GET/HEAD (/health, /metrics)
REFUSAL_LOG_INTERVAL_S = 10.0
LINGER_S = 2.0  # a refused connection is read (and discarded) this long before it is closed


class RefusalLog:
    """Refusals at a bounded rate: the first is logged at once, the rest as one line per interval
    with their count (a burst of thousands is two lines, not thousands)."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S):
        self.interval_s = interval_s
        self.total = 0
        self.pending = 0
        self._timer: asyncio.TimerHandle | None = None

    def refused(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.total += 1
        if self._timer is not None:
            self.pending += 1
            return
        logger.warning(
            "refusing requests over --max-connections %d with 503 + Retry-After; "
            "further refusals are counted and logged every %g s",
            limit,
            self.interval_s,
        )
        self._timer = loop.call_later(self.interval_s, self._flush, loop, limit)

    def _flush(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._timer = None
        if self.pending:
            logger.warning(
                "refused %d requests in the last %g s over --max-connections %d (%d in all)",
                self.pending,
                self.interval_s,
                limit,
                self.total,
            )
            self.pending = 0
            self._timer = loop.call_later(self.interval_s, self._flush, loop, limit)


def guarded_protocol(
    header_timeout_s: float, max_header_bytes: int, max_requests: int | None = None, refusals: RefusalLog | None = None
) -> type[HttpToolsProtocol]:
    refusals = refusals or RefusalLog()

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        """httptools with a deadline and a size bound on the request head, and a bound on the
        requests in progress (`--max-connections`): the first `max_requests` are served, the
        rest get 503 + Retry-After, and bodiless GET/HEAD probes keep PROBE_RESERVE more, so
        /health answers through a burst. Idle connections hold no slot (the head and keep-alive
        timeouts close them)."""

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_bytes = 0
            self._rejected = False
            self._head_timer: asyncio.TimerHandle | None = None
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timeout(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self._reject(
                    408,
                    "header_timeout",
                    f"request head not received within {header_timeout_s:g} s (--header-timeout-s)",
                )

        def _reject(self, status: int, kind: str, message: str) -> None:
            """Answer from the protocol itself (no request reached the app) and close, in the
            product's error body like every other refusal. What the client still sends is read
            and dropped for LINGER_S first: closing a socket with unread data resets it, and the
            reset can destroy the answer before the client reads it."""
            self._rejected = True
            self._disarm()
            assert BY_TYPE[kind].status == status  # every error type is in errors.py's table
            path = self.scope.get("path", "") if getattr(self, "scope", None) else ""
            body = json.dumps(
                render_error(
                    status, ItemError(type=kind, message=message, retryable=status in RETRYABLE_STATUSES), path
                )
            ).encode()
            retry = b"retry-after: %d\r\n" % RETRY_AFTER_S if status == 503 else b""
            head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, _PHRASES[status])
            self.transport.write(
                head + b"content-length: %d\r\n%sconnection: close\r\n\r\n%s" % (len(body), retry, body)
            )
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def _count(self, n: int) -> None:
            self._head_bytes += n
            if self._head_bytes > max_header_bytes and not self._rejected:
                self._reject(
                    431,
                    "request_head_too_large",
                    f"request line and headers exceed {max_header_bytes // 1024} KiB (--max-header-kb)",
                )

        def data_received(self, data: bytes) -> None:
            if self._rejected:
                return
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            if not self._rejected:
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._rejected:
                return
            self._disarm()
            if max_requests is not None:
                probe = self.parser.get_method() in (b"GET", b"HEAD")
                if len(self.tasks) >= max_requests + (PROBE_RESERVE if probe else 0):
                    self.scope["path"] = self.url.split(b"?", 1)[0].decode("latin-1")
                    refusals.refused(self.loop, max_requests)
                    self._reject(
                        503,
                        "overloaded",
                        f"the server has {len(self.tasks)} requests in progress, its limit "
                        f"(--max-connections {max_requests}); retry after the Retry-After seconds",
                    )
                    return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._rejected:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._rejected:
                super().on_message_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol


def server_config(app, settings) -> uvicorn.Config:
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        loop=loop,
        # the request limit is the guard's (uvicorn's own would also count idle connections)
        http=guarded_protocol(settings.header_timeout_s, settings.max_header_kb * 1024, settings.max_connections),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=2,
    )


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM / SIGINT: drain (see the module doc), then stop; the process exits 0
    if every request finished. A second signal stops at once. A watchdog ends the process if the
    shutdown itself hangs."""

    def __init__(self, config: uvicorn.Config, service, timeout_s: float, hard_exit: bool = True):
        super().__init__(config)
        self.service = service
        self.timeout_s = timeout_s
        self.hard_exit = hard_exit  # off when the server shares its process (in-process tests)
        self._draining: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: threading.Thread | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self.hard_exit:
            self._start_watchdog()
        if self._draining is not None or self.service.status != "ok" or self._loop is None:
            return super().handle_exit(sig, frame)
        logger.info("signal %s: draining before exit", sig)
        self._draining = self._loop.create_task(self._drain())

    def request_exit(self) -> None:
        """handle_exit from another thread (what a SIGTERM does), for embedding and tests."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.handle_exit, 15, None)

    async def _drain(self) -> None:
        await self.service.drain(self.timeout_s)
        self.should_exit = True

    def _start_watchdog(self) -> None:
        if self._watchdog is not None:
            return
        limit = self.timeout_s + EXIT_GRACE_S

        def watchdog() -> None:
            threading.Event().wait(limit)
            logger.error("shutdown did not finish %.0f s after the signal; exiting now", limit)
            logging.shutdown()
            os._exit(1)

        self._watchdog = threading.Thread(target=watchdog, name="exit-watchdog", daemon=True)
        self._watchdog.start()
