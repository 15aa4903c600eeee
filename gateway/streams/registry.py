"""The streams of one gateway process: opening them, binding each to the API
key that started it, the grace period after the last reader left, explicit
cancel, and (with Redis) the mirror that lets any gateway process resume or
cancel them.

A stream id is bound to its key: another key, or an id never issued, gets the
same 404, so ids reveal nothing. A stream's events stay resumable until its
grace period after the end (a reader that dropped just before the last token
can still fetch it); a running stream nobody reads is stopped after its
tier's grace period."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Coroutine
from typing import Any

from ..config import GatewayConfig
from ..core.policy import Caller
from ..ops.metrics import STREAMS_ACTIVE, STREAMS_ENDED
from .session import ErrorEvent, Producer, StreamSession
from .shared import SharedStreams

log = logging.getLogger(__name__)

# how often an expiring stream re-checks a reader attached through another gateway process
_REMOTE_RECHECK_S = 1.0


def new_stream_id() -> str:
    return "strm_" + secrets.token_urlsafe(18)


class StreamRegistry:
    def __init__(self, config: GatewayConfig, shared: SharedStreams | None = None) -> None:
        self.config = config
        self.shared = shared
        self._sessions: dict[str, StreamSession] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False  # draining without Redis: no stream is kept for a resume

    def open(
        self,
        caller: Caller,
        produce: Producer,
        error_event: ErrorEvent,
        stream_id: str | None = None,
        *,
        background: bool = False,
        summary: Any = None,
    ) -> StreamSession:
        """Start `produce` as a stream of `caller`'s, with one reader attached
        (the request that opened it; it detaches when its response ends). A
        background stream runs to its end without readers and stays readable
        for `gateway.streams.response_retention_s`."""
        session = StreamSession(
            stream_id or new_stream_id(),
            caller.key_id,
            caller.tier.stream_grace_s,
            self.config.streams.buffer_bytes,
            error_event,
        )
        session.background, session.summary = background, summary
        self._sessions[session.stream_id] = session
        session.readers = 1
        if self.shared is not None:
            self.shared.mirror(session, self.cancel_local, self._retention_s(session))
        STREAMS_ACTIVE.inc()
        session.start(produce)
        self._spawn(self._retire(session))
        return session

    def running(self) -> int:
        """Streams whose generation still runs (the drain waits for them)."""
        return sum(1 for s in self._sessions.values() if not s.done)

    def find(self, stream_id: str, caller: Caller) -> StreamSession | None:
        session = self._sessions.get(stream_id)
        if session is None or not secrets.compare_digest(session.key_id, caller.key_id):
            return None
        return session

    def attach(self, session: StreamSession) -> None:
        session.readers += 1

    def detach(self, session: StreamSession) -> None:
        session.readers -= 1
        if session.readers <= 0 and not session.done and not session.background:
            if self._closing:  # its reader left as the drain began
                self._expire_now(session, "no reader, and the gateway is shutting down")
            elif session.grace_s <= 0:
                self._expire_now(session, "no reader (no grace period)")
            else:
                self._spawn(self._expire_later(session))

    def expire_unread(self) -> None:
        """At the start of a drain: a stream whose reader hung up is stopped
        now, not at the end of its grace period. Nobody resumes it through a
        gateway that is going away; with Redis a reader elsewhere may, and its
        expiry stays as it was."""
        if self.shared is not None:
            return
        self._closing = True
        for session in list(self._sessions.values()):
            if session.readers <= 0 and not session.done and not session.background:
                self._expire_now(session, "no reader, and the gateway is shutting down")

    def cancel_local(self, stream_id: str) -> bool:
        session = self._sessions.get(stream_id)
        if session is None:
            return False
        if not session.done:
            session.end_reason = "deleted"
            session.cancel()
        return True

    def cancel(self, session: StreamSession) -> None:
        """DELETE: stop now (the producer's cleanup stops the engine request)."""
        self.cancel_local(session.stream_id)

    async def _expire_later(self, session: StreamSession) -> None:
        await asyncio.sleep(session.grace_s)
        while session.readers <= 0 and not session.done:
            if self.shared is not None and await self.shared.attached_elsewhere(session.stream_id):
                await asyncio.sleep(_REMOTE_RECHECK_S)
                continue
            self._expire_now(session, f"no reader for its grace period ({session.grace_s:g} s)")
            return

    def _expire_now(self, session: StreamSession, why: str) -> None:
        log.info("stream %s stopped: %s", session.stream_id, why)
        session.end_reason = "expired"
        session.cancel()

    async def _retire(self, session: StreamSession) -> None:
        """Forget the stream its grace period after it ended."""
        await session.wait_closed()
        STREAMS_ACTIVE.dec()
        STREAMS_ENDED.labels(outcome=session.end_reason or ("refused" if session.failure else "completed")).inc()
        await asyncio.sleep(self._retention_s(session))
        self._sessions.pop(session.stream_id, None)

    def _retention_s(self, session: StreamSession) -> float:
        """How long a stream stays readable after its end."""
        return self.config.streams.response_retention_s if session.background else max(session.grace_s, 1.0)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, session: StreamSession) -> None:
        """A stream refused before its first event: nothing to resume."""
        self._sessions.pop(session.stream_id, None)

    async def aclose(self) -> None:
        """At shutdown: stop every stream (their engine requests included)."""
        for session in list(self._sessions.values()):
            session.cancel()
        await asyncio.gather(*(s.wait_closed() for s in list(self._sessions.values())), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shared is not None:
            await self.shared.aclose()
