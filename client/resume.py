"""Resuming a dropped SSE stream through the gateway, so that the caller of
`client.stream()` sees one uninterrupted stream.

The gateway numbers its events (`id: 1`, `id: 2`, ...), names the stream in the
`X-Stream-Id` response header, and keeps generating for a grace period (~10 s)
after a connection drops. When the connection breaks (a transport error, or the
body ends before the event with a `finish_reason`), this wrapper reconnects with
`GET /v1/streams/{id}` and `Last-Event-ID: <last id delivered>`, skips any event
it already delivered, and goes on yielding:

    config = ClientConfig(url="http://127.0.0.1:9000", api_key=os.environ["LLM_API_KEY"],
                          retry=RetryConfig(resume_attempts=3, resume_backoff_max_s=2.0))
    async with AsyncLLMClient(config) as client:
        result = await client.generate("Hello", max_tokens=64)
    result.resumes   # reconnections it took; result.finish_reason "error" if it could not resume

Each drop gets up to `RetryConfig.resume_attempts` reconnections (full-jitter
backoff, the first one at once: the gateway's buffer and grace period are
bounded, so waiting loses events). 404 (unknown stream, or another key's) and
410 (the events after the last one received are no longer buffered) end it at
once with `StreamResumeError`, which the stream reports as `finish_reason: error`.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_random_exponential

from .config import RetryConfig
from .errors import RequestError, ServerConnectionError, StreamResumeError
from .retry import Sleep
from .types import StreamEvent

log = logging.getLogger(__name__)

# Statuses of a resume that may pass (a proxy or an overloaded gateway); any
# other refusal will not change by asking again.
RETRYABLE_RESUME_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_REFUSALS = {
    404: "the gateway does not know the stream (it is over, or not this key's)",
    410: "the events after it are no longer buffered",
}


class EventConnection(Protocol):
    """One SSE connection (sse_transport.SseResponseStream)."""

    event_id: int | None

    async def next_event(self) -> StreamEvent | None: ...

    async def aclose(self) -> None: ...


class ResumeEndpoint(Protocol):
    """The gateway's stream routes (sse_transport.SseTransport)."""

    async def open_resume(self, stream_id: str, last_event_id: int) -> EventConnection: ...

    async def delete_stream(self, stream_id: str) -> None: ...


def _worth_retrying(exc: BaseException) -> bool:
    return isinstance(exc, ServerConnectionError) and not isinstance(exc, StreamResumeError)


class ResumableSseStream:
    """A `ResponseStream` over successive connections to one gateway stream."""

    def __init__(
        self, first: EventConnection, stream_id: str, endpoint: ResumeEndpoint, config: RetryConfig, sleep: Sleep
    ) -> None:
        self.stream_id = stream_id
        self.resumes = 0
        self._connection = first
        self._endpoint = endpoint
        self._config = config
        self._sleep = sleep
        self._last_id = 0  # the id of the last event delivered (0: none yet, all are wanted)
        self._unnumbered = False  # an event without an id was delivered: a resume could repeat it
        self._ended = False  # the event with the finish_reason was delivered

    async def next_event(self) -> StreamEvent | None:
        if self._ended:
            return await self._read_to_close()
        try:
            return await self._next_new()
        except ServerConnectionError as exc:
            return await self._resume(exc)

    async def aclose(self) -> None:
        await self._connection.aclose()

    async def cancel(self) -> None:
        await self._endpoint.delete_stream(self.stream_id)

    async def _next_new(self) -> StreamEvent:
        """The next event not yet delivered. A connection that ends before the
        final event is a drop: the gateway closes a stream only after it."""
        while True:
            event = await self._connection.next_event()
            if event is None:
                raise ServerConnectionError("the SSE stream ended before its final event")
            event_id = self._connection.event_id
            if event_id is None:
                self._unnumbered = True
            elif event_id <= self._last_id:
                continue  # delivered before the drop
            else:
                self._last_id = event_id
            self._ended = event.final or event.finish_reason is not None
            return event

    async def _read_to_close(self) -> StreamEvent | None:
        # After the final event only the close is left; reading it lets httpx
        # reuse the connection, and a drop now has lost nothing.
        try:
            return await self._connection.next_event()
        except ServerConnectionError:
            return None

    async def _resume(self, cause: ServerConnectionError) -> StreamEvent:
        attempts = self._config.resume_attempts
        log.info("stream %s dropped after event %d (%s); resuming", self.stream_id, self._last_id, cause)
        if attempts == 0:
            raise StreamResumeError(self._why(f"resuming is off (resume_attempts=0); {cause}"))
        if self._unnumbered:
            raise StreamResumeError(self._why(f"its events carry no id, so a resume could repeat them; {cause}"))
        retrying = AsyncRetrying(
            retry=retry_if_exception(_worth_retrying),
            stop=stop_after_attempt(attempts),
            wait=wait_random_exponential(multiplier=self._config.backoff_base_s, max=self._config.resume_backoff_max_s),
            sleep=self._sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._reconnect()
                    # Within the attempt: a resume the gateway accepts and drops
                    # again before any new event has made no progress.
                    return await self._next_new()
        except StreamResumeError:
            raise
        except ServerConnectionError as exc:
            raise StreamResumeError(self._why(f"gave up after {attempts} attempt(s); last: {exc}")) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _reconnect(self) -> None:
        await self._connection.aclose()
        try:
            self._connection = await self._endpoint.open_resume(self.stream_id, self._last_id)
        except RequestError as exc:
            if exc.status in RETRYABLE_RESUME_STATUSES:
                raise ServerConnectionError(f"resume refused for now: {exc}") from exc
            reason = _REFUSALS.get(exc.status or 0, "the gateway refused the resume")
            raise StreamResumeError(self._why(f"{reason} ({exc})")) from exc
        self.resumes += 1
        log.info("stream %s resumed after event %d (resume %d)", self.stream_id, self._last_id, self.resumes)

    def _why(self, reason: str) -> str:
        return f"stream {self.stream_id} dropped after event {self._last_id} and could not be resumed: {reason}"

    def _log_retry(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.info("resume %d of stream %s failed (%s); next in %.3fs", state.attempt_number, self.stream_id, exc, wait)
