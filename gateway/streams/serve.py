"""Answering a streamed request as a resumable stream, and the SSE reader
response shared by the first connection and every resume.

Before the 200: the request waits for its stream's first event for up to one
keep-alive interval, so that a refusal (bad input the text stages found, an
overloaded engine) is still an HTTP status. A request still queued or
prefilling after that gets its 200 and an SSE comment line (`: keep-alive`)
every interval while no event flows (queueing, prefill, a stall, a
migration): a proxy with a 60 s read timeout in between never sees a silent
minute. A refusal after that point arrives as the stream's last event."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..core.errors import GatewayError
from ..core.hangup import HungUp, disconnected, unless_hung_up
from ..core.policy import Caller
from ..ops.metrics import STREAM_RESUMES
from .registry import StreamRegistry
from .session import ErrorEvent, Event, Producer, StreamGone, StreamSession
from .shared import SharedStreams

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# A comment LINE, not a comment block: no blank line after it, so it ends no
# event and no decoder dispatches anything. With "\n\n" the openai SDK and
# httpx-sse, which keep the last `id:` across events as the SSE spec says,
# dispatched an event with empty data after any event with an id (ours all
# have one), and the SDK's json.loads("") failed the stream. A comment line is
# ignored wherever it falls (WHATWG "event stream interpretation"): before the
# first event, between events, or as a stream's last bytes.
KEEPALIVE = b": keep-alive\n"
STREAM_ID_HEADER = "X-Stream-Id"
# nginx's status for "the client closed the request": only ever logged, nobody receives it
CLIENT_CLOSED_REQUEST = 499


def registry_of(request: Request) -> StreamRegistry:
    return request.app.state.streams


async def serve_resumable(
    request: Request,
    caller: Caller,
    produce: Producer,
    *,
    error_event: ErrorEvent,
    headers: dict[str, str] | None = None,
    stream_id: str | None = None,
    background: bool = False,
    summary: Any = None,
) -> Response:
    """The SSE answer to a streamed request. `produce()` yields whole SSE
    events (b"data: ...\\n\\n"); a GatewayError it raises before its first
    event is the HTTP answer; its own cleanup stops the engine request and
    releases the admission however it ends (completed, expired, deleted)."""
    registry = registry_of(request)
    session = registry.open(caller, produce, error_event, stream_id, background=background, summary=summary)
    keepalive_s = registry.config.streams.keepalive_interval_s
    try:
        await unless_hung_up(session.wait_first(keepalive_s), request.receive)
    except HungUp:
        if background:
            registry.detach(session)  # a background stream goes on without this reader
        else:
            # gone before anything was sent: it never learnt the stream id, so nothing to keep
            session.end_reason = "hung_up"
            session.cancel()
            registry.forget(session)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if session.failure is not None and session.last_seq <= 1:
        registry.detach(session)
        registry.forget(session)
        raise session.failure
    all_headers = {**SSE_HEADERS, **(headers or {}), STREAM_ID_HEADER: session.stream_id}
    return ReaderResponse(session.read(0, keepalive_s), all_headers, on_close=lambda: registry.detach(session))


class ReaderResponse(Response):
    """SSE from a stream's events (each with its `id:`) and keep-alive comments.
    It ends the moment the caller hangs up, leaving the stream running for
    its grace period: only the reader goes away."""

    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncIterator[Event | None], headers: dict[str, str], on_close: Callable[[], object]
    ) -> None:
        # not Response.__init__: it would render an empty body and announce Content-Length: 0
        self.status_code = 200
        self.background = None
        self._events = events
        self._on_close = on_close
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        hangup = asyncio.ensure_future(disconnected(receive))
        try:
            await asyncio.wait({pump, hangup}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hangup.cancel()
            if not pump.done():
                pump.cancel()
            await asyncio.gather(pump, hangup, return_exceptions=True)
            # type-ignored below: an async generator, typed as its AsyncIterator
            await self._events.aclose()  # type: ignore[attr-defined]
            outcome = self._on_close()
            if isinstance(outcome, Awaitable):
                await outcome

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for event in self._events:
                body = KEEPALIVE if event is None else event.frame()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except StreamGone as exc:
            # a reader too slow for the buffer: it ends here, and its resume answers 410
            log.warning("a stream reader fell behind the buffer: %s", exc)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def parse_last_event_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    try:
        seq = int(value.strip())
    except ValueError:
        seq = -1
    if seq < 0:
        raise GatewayError(
            400, "Last-Event-ID must be the id of an event of this stream (a number >= 0).", param="Last-Event-ID"
        )
    return seq


async def resume(request: Request, caller: Caller, stream_id: str, after: int | None = None) -> Response:
    """The events after `after` (default: the `Last-Event-ID` header; none: all), then live ones."""
    registry = registry_of(request)
    if after is None:
        after = parse_last_event_id(request.headers.get("last-event-id"))
    keepalive_s = registry.config.streams.keepalive_interval_s
    headers = {**SSE_HEADERS, STREAM_ID_HEADER: stream_id}
    session = registry.find(stream_id, caller)
    if session is not None:
        _check_after(session, after)
        registry.attach(session)
        STREAM_RESUMES.labels(where="local").inc()
        return ReaderResponse(session.read(after, keepalive_s), headers, on_close=lambda: registry.detach(session))
    shared = registry.shared
    if shared is None or not await owned_by(shared, stream_id, caller):
        raise _not_found(stream_id)
    try:
        await shared.check_resumable(stream_id, after)
    except StreamGone as exc:
        raise _gone(exc) from None
    STREAM_RESUMES.labels(where="shared").inc()
    return ReaderResponse(
        shared.read(stream_id, after, keepalive_s), headers, on_close=lambda: shared.release(stream_id)
    )


async def delete(request: Request, caller: Caller, stream_id: str) -> Response:
    registry = registry_of(request)
    session = registry.find(stream_id, caller)
    if session is not None:
        registry.cancel(session)
        await session.wait_closed()  # the engine request is stopped when this answers
        return Response(status_code=204)
    shared = registry.shared
    if shared is None or not await owned_by(shared, stream_id, caller):
        raise _not_found(stream_id)
    await shared.request_cancel(stream_id)
    return Response(status_code=204)


def _check_after(session: StreamSession, after: int) -> None:
    if after > session.last_seq:
        raise GatewayError(
            400, f"Last-Event-ID {after} is past this stream's last event ({session.last_seq}).", param="Last-Event-ID"
        )
    try:
        session.events_after(after)
    except StreamGone as exc:
        raise _gone(exc) from None


async def owned_by(shared: SharedStreams, stream_id: str, caller: Caller) -> bool:
    owner = await shared.owner_key(stream_id)
    return owner is not None and secrets.compare_digest(owner, caller.key_id)


def _not_found(stream_id: str) -> GatewayError:
    return GatewayError(
        404,
        "No such stream for this API key (unknown, expired, or another key's).",
        param="stream_id",
        code="stream_not_found",
    )


def _gone(exc: StreamGone) -> GatewayError:
    return GatewayError(
        410, f"The stream can no longer be resumed from there: {exc}.", param="Last-Event-ID", code="stream_gone"
    )
