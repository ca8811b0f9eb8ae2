"""Process lifecycle: drain on SIGTERM instead of dropping work in progress."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM / SIGINT: /health answers 503 `draining`, new work gets 503, work in
    progress finishes (up to the shutdown timeout), then the server stops and the process exits 0.
    A second signal, or a signal while not serving, stops at once (uvicorn's own behaviour)."""

    def __init__(self, config: uvicorn.Config, service, timeout_s: float):
        super().__init__(config)
        self.service = service
        self.timeout_s = timeout_s
        self._draining: asyncio.Task | None = None

    def handle_exit(self, sig, frame) -> None:
        if self._draining is not None or self.service.status != "ok":
            return super().handle_exit(sig, frame)
        logger.info("signal %s: draining before exit", sig)
        self._draining = asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        await self.service.drain(self.timeout_s)
        self.should_exit = True
