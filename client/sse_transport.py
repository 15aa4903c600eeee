"""SSE transport: `POST /v2/models/<model>/generate_stream` over pooled httpx connections."""
from __future__ import annotations

import json
import logging
from typing import Any, Mapping

import httpx
from httpx_sse import EventSource, SSEError

from .config import TimeoutConfig
from .errors import RequestError, ServerConnectionError
from .payload import event_from_outputs, generate_body, stop_generate_body
from .retry import parse_retry_after
from .timing import DEFAULT_CLOCK, Clock
from .types import StreamEvent

log = logging.getLogger(__name__)


def error_message(body: bytes) -> str:
    """The `error` text of a Triton error body: plain JSON or one SSE `data:` event."""
    text = body.decode("utf-8", errors="replace").strip()
    candidates = [text] + [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict) and "error" in parsed:
            return str(parsed["error"])
    return text or "empty error response"


class SseResponseStream:
    def __init__(self, response: httpx.Response, clock: Clock) -> None:
        self._response = response
        self._events = EventSource(response).aiter_sse()
        self._clock = clock
        self._closed = False

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
            try:
                data = json.loads(sse.data)
            except ValueError as exc:
                raise RequestError(f"malformed SSE data: {sse.data[:200]!r}") from exc
            if not isinstance(data, dict):
                raise RequestError(f"SSE data is not a JSON object: {sse.data[:200]!r}")
            if "error" in data:
                raise RequestError(str(data["error"]))
            return event_from_outputs(data, received)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._events.aclose()
        finally:
            await self._response.aclose()


class SseTransport:
    name = "sse"

    def __init__(self, base_url: str, timeouts: TimeoutConfig, max_connections: int = 256,
                 http_transport: httpx.AsyncBaseTransport | None = None, clock: Clock = DEFAULT_CLOCK) -> None:
        # read=None: the gap between tokens is policed by the client's per-token
        # timeout, which knows the request; a socket read timeout would not.
        timeout = httpx.Timeout(connect=timeouts.connect_s, read=None, write=timeouts.write_s, pool=None)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits, transport=http_transport)
        self._stop_timeout = timeouts.stop_s
        self._clock = clock

    async def open_stream(self, model: str, values: Mapping[str, Any], request_id: str) -> SseResponseStream:
        request = self._http.build_request(
            "POST", f"/v2/models/{model}/generate_stream", json=generate_body(values, request_id),
            headers={"Accept": "text/event-stream", "Cache-Control": "no-store"})
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise ServerConnectionError(f"cannot reach {self._http.base_url}: {exc!r}") from exc
        if response.status_code != 200:
            try:
                body = await response.aread()
            finally:
                await response.aclose()
            raise RequestError(error_message(body), response.status_code,
                               parse_retry_after(response.headers.get("retry-after")))
        return SseResponseStream(response, self._clock)

    async def send_stop(self, model: str, request_id: str, request_key: str) -> None:
        # Triton's `infer` endpoint refuses decoupled models (HTTP 501), so the
        # stop goes through `generate`, which accepts them.
        try:
            response = await self._http.post(f"/v2/models/{model}/generate",
                                             json=stop_generate_body(request_id, request_key),
                                             timeout=self._stop_timeout)
        except httpx.TransportError as exc:
            raise ServerConnectionError(f"stop request failed: {exc!r}") from exc
        if response.status_code != 200:
            raise RequestError(error_message(response.content), response.status_code)

    async def aclose(self) -> None:
        await self._http.aclose()
