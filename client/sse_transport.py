"""SSE transport: `POST /v2/models/<model>/generate_stream` over pooled httpx connections.

Talking to Triton directly this is plain SSE. Through the gateway (an
`api_key`), every request carries `Authorization: Bearer <key>`, and a response
with an `X-Stream-Id` header is wrapped in `resume.ResumableSseStream`, which
reconnects a dropped stream with `GET /v1/streams/{id}` + `Last-Event-ID` and
cancels with `DELETE /v1/streams/{id}`; those two routes live here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
from httpx_sse import EventSource, SSEError

from .config import RetryConfig, TimeoutConfig
from .errors import RequestError, ServerConnectionError
from .payload import event_from_outputs, generate_body, stop_generate_body
from .resume import ResumableSseStream
from .retry import Sleep, parse_retry_after
from .timing import DEFAULT_CLOCK, Clock
from .types import StreamEvent

log = logging.getLogger(__name__)
_SSE_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}


def error_message(body: bytes) -> str:
    """The `error` text of a Triton error body: plain JSON or one SSE `data:` event
    (the gateway's own routes answer OpenAI's `{"error": {"message": ...}}`)."""
    text = body.decode("utf-8", errors="replace").strip()
    candidates = [text] + [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict) and "error" in parsed:
            error = parsed["error"]
            if isinstance(error, dict) and "message" in error:
                return str(error["message"])
            return str(error)
    return text or "empty error response"


def _event_id(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


class SseResponseStream:
    """One SSE connection. `stream_id` is the gateway's `X-Stream-Id` (None from
    Triton); `event_id` the `id:` of the event `next_event` returned last (None
    when it had none): the gateway numbers its events 1, 2, 3, ..."""

    resumes = 0

    def __init__(self, response: httpx.Response, clock: Clock) -> None:
        self._response = response
        self._events = EventSource(response).aiter_sse()
        self._clock = clock
        self._closed = False
        self._previous_id = ""
        self.stream_id: str | None = response.headers.get("x-stream-id") or None
        self.event_id: int | None = None

    async def next_event(self) -> StreamEvent | None:
        while True:
            try:
                sse = await self._events.__anext__()
            except StopAsyncIteration:
                return None
            except SSEError as exc:
                raise RequestError(f"not an SSE stream: {exc}", self._response.status_code) from exc
            except httpx.TransportError as exc:
                raise ServerConnectionError(f"SSE stream broke: {exc!r}") from exc
            if not sse.data:
                continue  # keep-alive or comment-only event
            received = self._clock()
            # httpx-sse repeats the last `id:` on an event that has none (the SSE
            # spec's "last event ID"), so an unchanged id is no id of its own.
            own_id = sse.id if sse.id != self._previous_id else ""
            self._previous_id = sse.id
            try:
                data = json.loads(sse.data)
            except ValueError as exc:
                raise RequestError(f"malformed SSE data: {sse.data[:200]!r}") from exc
            if not isinstance(data, dict):
                raise RequestError(f"SSE data is not a JSON object: {sse.data[:200]!r}")
            if "error" in data:
                raise RequestError(str(data["error"]))
            self.event_id = _event_id(own_id) if own_id else None
            return event_from_outputs(data, received)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._events.aclose()
        finally:
            await self._response.aclose()

    async def cancel(self) -> None:
        """Nothing to do: without a stream id there is no gateway stream to cancel
        (Triton directly is stopped with `send_stop`)."""


class SseTransport:
    name = "sse"

    def __init__(
        self,
        base_url: str,
        timeouts: TimeoutConfig,
        max_connections: int = 256,
        http_transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = DEFAULT_CLOCK,
        *,
        api_key: str | None = None,
        retry: RetryConfig | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        # read=None: the gap between tokens is policed by the client's per-token
        # timeout, which knows the request; a socket read timeout would not.
        timeout = httpx.Timeout(connect=timeouts.connect_s, read=None, write=timeouts.write_s, pool=None)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # A default header of the pool, so every route (generate, resume, cancel)
        # carries it; httpx masks `authorization` in the repr of headers.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = httpx.AsyncClient(
            base_url=base_url, timeout=timeout, limits=limits, transport=http_transport, headers=headers
        )
        self._stop_timeout = timeouts.stop_s
        self._clock = clock
        self._retry = retry or RetryConfig()
        self._sleep = sleep

    async def open_stream(
        self, model: str, values: Mapping[str, Any], request_id: str
    ) -> SseResponseStream | ResumableSseStream:
        request = self._http.build_request(
            "POST", f"/v2/models/{model}/generate_stream", json=generate_body(values, request_id), headers=_SSE_HEADERS
        )
        stream = await self._send_sse(request)
        stream_id = stream.stream_id
        if not stream_id:
            return stream  # Triton directly (or a gateway without resume): plain SSE
        return ResumableSseStream(stream, stream_id, self, self._retry, self._sleep)

    async def open_resume(self, stream_id: str, last_event_id: int) -> SseResponseStream:
        """The gateway's events after `last_event_id`, then live ones. A refusal
        is a `RequestError` with its status (404 unknown stream, 410 no longer buffered)."""
        request = self._http.build_request(
            "GET", _stream_path(stream_id), headers={**_SSE_HEADERS, "Last-Event-ID": str(last_event_id)}
        )
        return await self._send_sse(request)

    async def delete_stream(self, stream_id: str) -> None:
        """Stop a gateway stream (its engine request and KV blocks); 404 = already over."""
        try:
            response = await self._http.delete(_stream_path(stream_id), timeout=self._stop_timeout)
        except httpx.TransportError as exc:
            raise ServerConnectionError(f"cancel request failed: {exc!r}") from exc
        if response.status_code == 404:
            log.debug("cancel of stream %s: already over", stream_id)
        elif not response.is_success:
            raise RequestError(error_message(response.content), response.status_code)

    async def _send_sse(self, request: httpx.Request) -> SseResponseStream:
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise ServerConnectionError(f"cannot reach {self._http.base_url}: {exc!r}") from exc
        if response.status_code != 200:
            try:
                body = await response.aread()
            finally:
                await response.aclose()
            raise RequestError(
                error_message(body), response.status_code, parse_retry_after(response.headers.get("retry-after"))
            )
        return SseResponseStream(response, self._clock)

    async def ready(self, timeout_s: float) -> bool:
        # One deadline for the whole call (connect and answer): a readiness check
        # that hangs is as good as a "no" to whoever routes on it.
        try:
            response = await asyncio.wait_for(self._http.get("/v2/health/ready", timeout=timeout_s), timeout_s)
        except (TimeoutError, httpx.HTTPError) as exc:
            log.debug("readiness of %s: %r", self._http.base_url, exc)
            return False
        return response.status_code == 200

    async def send_stop(self, model: str, request_id: str, request_key: str) -> None:
        # Triton's `infer` endpoint refuses decoupled models (HTTP 501), so the
        # stop goes through `generate`, which accepts them.
        try:
            response = await self._http.post(
                f"/v2/models/{model}/generate",
                json=stop_generate_body(request_id, request_key),
                timeout=self._stop_timeout,
            )
        except httpx.TransportError as exc:
            raise ServerConnectionError(f"stop request failed: {exc!r}") from exc
        if response.status_code != 200:
            raise RequestError(error_message(response.content), response.status_code)

    async def aclose(self) -> None:
        await self._http.aclose()


def _stream_path(stream_id: str) -> str:
    return f"/v1/streams/{quote(stream_id, safe='')}"
