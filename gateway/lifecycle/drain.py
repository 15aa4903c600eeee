"""Shutting the gateway down without losing what it admitted.

On the first SIGTERM / SIGINT the gateway stops admitting: `/health` answers
503 (a load balancer or Kubernetes readiness probe takes it out of rotation),
and a new POST gets 503 with `Retry-After` and `Connection: close`, so its
client goes elsewhere. Requests already admitted (streams, whole answers,
background responses) run on; once none is left, or after
`gateway.drain_timeout_s`, uvicorn's own graceful shutdown closes the rest.
A second signal stops at once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from ..bodies.guard import ASGIApp, Receive, Scope, Send
from ..ops.metrics import DRAINING

log = logging.getLogger(__name__)


class DrainState:
    def __init__(self) -> None:
        self.draining = False
        # called in the event loop as the drain starts (the streams' expire_unread)
        self.on_drain: list[Callable[[], None]] = []

    def begin(self) -> None:
        if not self.draining:
            self.draining = True
            DRAINING.set(1)
            log.info("draining: no new requests; waiting for the admitted ones to finish")


class DrainGuard:
    """ASGI: while draining, a new POST is refused before anything else runs."""

    def __init__(self, app: ASGIApp, state: DrainState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.state.draining and scope["type"] == "http" and scope["method"] == "POST":
            body = json.dumps(
                {
                    "error": {
                        "message": "The gateway is shutting down; retry on another one.",
                        "type": "api_error",
                        "param": None,
                        "code": "draining",
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", b"1"),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await self.app(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain before its own graceful shutdown."""

    def __init__(
        self, config: uvicorn.Config, state: DrainState, busy: Callable[[], int], drain_timeout_s: float
    ) -> None:
        super().__init__(config)
        self.drain_state = state
        self._busy = busy
        self._drain_timeout_s = drain_timeout_s
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain_state.draining:
            super().handle_exit(sig, frame)  # a second signal: uvicorn's own exit
            return
        self.drain_state.begin()
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        started = time.monotonic()
        for hook in self.drain_state.on_drain:
            hook()
        while self._busy() > 0 and time.monotonic() - started < self._drain_timeout_s:
            await asyncio.sleep(0.1)
        left = self._busy()
        if left:
            log.warning("drain timeout (%.0f s): %d requests still running are stopped", self._drain_timeout_s, left)
        else:
            log.info("drained in %.1f s", time.monotonic() - started)
        self.should_exit = True
