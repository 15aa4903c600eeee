"""The seam between the client logic and the wire: one protocol, two transports.

A transport opens one request's response stream and sends `stop` requests. It
reports an in-band server error as `RequestError` and a broken connection as
`ServerConnectionError`; what that means (retry, or `finish_reason: error`)
is decided by the caller, which knows whether data has already arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .types import StreamEvent


class ResponseStream(Protocol):
    # Reconnections made so far (SSE through the gateway resumes dropped streams).
    resumes: int

    async def next_event(self) -> StreamEvent | None:
        """The next response, or None once the stream has ended."""

    async def aclose(self) -> None:
        """Stop reading and release the connection or cancel the call; idempotent."""

    async def cancel(self) -> None:
        """Through the gateway: ask it to stop the request (SSE: DELETE
        /v1/streams/{id}). A no-op where closing is enough (gRPC: the RPC cancel)
        or no stream id is known. Best effort; called after `aclose`."""


class Transport(Protocol):
    name: str

    async def open_stream(self, model: str, values: Mapping[str, Any], request_id: str) -> ResponseStream:
        """Send one streaming request."""

    async def send_stop(self, model: str, request_id: str, request_key: str) -> None:
        """Ask `model` (the LLM step) to stop the request holding `request_key`;
        `request_id` only names the stop in the server's logs."""

    async def ready(self, timeout_s: float) -> bool:
        """Whether the server says it is ready (Triton's readiness, or the
        gateway's answer to the same call) within `timeout_s`; False when it
        cannot be reached, answers not ready, or takes longer."""

    async def aclose(self) -> None:
        """Close pooled connections."""
