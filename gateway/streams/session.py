"""One resumable stream: its producer runs as a task of its own, detached
from any connection, and writes numbered SSE events into a bounded buffer;
connections are readers of that buffer.

Why detached: a connection that drops on a flaky network must not end the
generation. The engine request goes on for the tier's grace period while
nobody reads; a reader that comes back with `Last-Event-ID` gets what it
missed from the buffer and then the live events. With nobody back by the end
of the grace period, the producer is cancelled: its own cleanup stops the
engine request by key (freeing the KV blocks) and releases the admission."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import GatewayError

log = logging.getLogger(__name__)

Producer = Callable[[], AsyncIterator[bytes]]
ErrorEvent = Callable[[GatewayError], bytes]


class StreamGone(Exception):
    """The events after the reader's position are no longer buffered (410)."""


@dataclass(frozen=True)
class Event:
    seq: int  # 1, 2, ...: the SSE `id`
    data: bytes  # a whole SSE event without its id line (b"data: ...\n\n")

    def frame(self) -> bytes:
        return b"id: %d\n" % self.seq + self.data


class StreamSession:
    def __init__(self, stream_id: str, key_id: str, grace_s: float, buffer_bytes: int, error_event: ErrorEvent) -> None:
        self.stream_id = stream_id
        self.key_id = key_id
        self.grace_s = grace_s
        self._buffer_bytes = buffer_bytes
        self._error_event = error_event
        self._events: deque[Event] = deque()
        self._buffered = 0
        self.last_seq = 0
        self.done = False
        # a refusal before the first event: the caller's HTTP answer, if no response has started
        self.failure: GatewayError | None = None
        self.readers = 0
        self.end_reason: str | None = None  # "expired" / "deleted" when stopped from outside
        # a background response runs to its end whether or not anyone reads
        self.background = False
        # what GET /v1/responses/{id} answers (an object with `snapshot() -> dict`), if anything
        self.summary: Any = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._listeners: list[Callable[[Event | None], None]] = []

    # the producer side

    def start(self, produce: Producer) -> None:
        self._task = asyncio.ensure_future(self._pump(produce))

    async def _pump(self, produce: Producer) -> None:
        self._started = True
        events = produce()
        try:
            async for data in events:
                await self._append(data)
        except GatewayError as error:
            # a refusal (before the first event, or after a 200 was committed
            # for keep-alives): readers get it as the stream's last event
            self.failure = error
            await self._append(self._error_event(error))
        except asyncio.CancelledError:
            log.info("stream %s stopped (cancelled or expired) after %d events", self.stream_id, self.last_seq)
        except Exception:
            log.exception("stream %s: the producer failed after %d events", self.stream_id, self.last_seq)
            await self._append(self._error_event(GatewayError(500, "Internal error.", code="internal_error")))
        finally:
            # type-ignored below: the producer is an async generator, typed as its AsyncIterator
            await asyncio.shield(events.aclose())  # type: ignore[attr-defined]
            await self._finish()

    async def _append(self, data: bytes) -> None:
        self.last_seq += 1
        event = Event(self.last_seq, data)
        self._events.append(event)
        self._buffered += len(data)
        # the newest event always stays, however large
        while self._buffered > self._buffer_bytes and len(self._events) > 1:
            self._buffered -= len(self._events.popleft().data)
        for listener in self._listeners:
            listener(event)
        async with self._changed:
            self._changed.notify_all()

    async def _finish(self) -> None:
        self.done = True
        for listener in self._listeners:
            listener(None)
        async with self._changed:
            self._changed.notify_all()

    def on_event(self, listener: Callable[[Event | None], None]) -> None:
        """`listener(event)` for each new event, `listener(None)` at the end
        (the shared store mirrors the stream this way)."""
        self._listeners.append(listener)

    @property
    def oldest_seq(self) -> int:
        return self._events[0].seq if self._events else self.last_seq + 1

    def cancel(self) -> None:
        if self._task is None or self._task.done():
            return
        if not self._started:
            # a task cancelled before its first step never runs the producer,
            # whose own cleanup (stop by key, release the admission) would then
            # never run either: cancel once it has started
            asyncio.get_running_loop().call_soon(self.cancel)
            return
        self._task.cancel()

    async def wait_closed(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    # the reader side

    async def wait_first(self, timeout_s: float) -> bool:
        """True when an event arrived (or the stream ended) within `timeout_s`."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.last_seq > 0 or self.done), timeout_s)
            except TimeoutError:
                return False
        return True

    def events_after(self, seq: int) -> list[Event]:
        """The buffered events after `seq`; StreamGone when some were dropped."""
        if seq + 1 < self.oldest_seq:
            raise StreamGone(f"events after {seq} are no longer buffered (oldest kept: {self.oldest_seq})")
        return [event for event in self._events if event.seq > seq]

    async def wait_after(self, seq: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for an event after `seq` or the end; False on timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.last_seq > seq or self.done), timeout_s)
            except TimeoutError:
                return False
        return True

    async def read(self, after: int, keepalive_s: float) -> AsyncIterator[Event | None]:
        """Events after `after` as they come, to the end of the stream; None
        when `keepalive_s` passed without one (the reader sends a comment)."""
        position = after
        while True:
            for event in self.events_after(position):
                position = event.seq
                yield event
            if self.done and position >= self.last_seq:
                return
            if not await self.wait_after(position, keepalive_s):
                yield None
