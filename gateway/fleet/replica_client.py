"""One replica's connection: the client library's `AsyncLLMClient` over gRPC
streaming, one client (one HTTP/2 channel) per replica and gateway process.

The gateway mints each engine request's Triton id and the client library its
request key, so a caller can neither collide with nor stop anyone else's
request. A refusal before the first response is the caller's GatewayError
(core/upstream.py's `map_error`); a failure after it, UpstreamFailure."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from client import (
    AsyncLLMClient,
    ClientConfig,
    ClientTimeoutError,
    GenerationOptions,
    GenerationResult,
    RequestError,
    RetryConfig,
    StreamEvent,
    TimeoutConfig,
)

from ..core.errors import GatewayError
from ..core.upstream import UPSTREAM_TOKEN_TIMEOUT_S, UpstreamFailure, UpstreamStalled, map_error
from ..ops.metrics import UPSTREAM_ERRORS

log = logging.getLogger(__name__)


def client_config(grpc_url: str) -> ClientConfig:
    # No retries here: an overloaded engine answers the caller at once with 503 +
    # Retry-After (its SDK backs off); retrying inside the gateway would hold the
    # request and multiply the load exactly when the engine is full.
    return ClientConfig(
        url=grpc_url,
        transport="grpc",
        model="ensemble",
        retry=RetryConfig(max_attempts=1),
        timeouts=TimeoutConfig(first_token_s=300.0, token_s=UPSTREAM_TOKEN_TIMEOUT_S),
    )


class StreamingClient(Protocol):
    """What the gateway uses of the client library's `AsyncLLMClient` (tests put a fake transport under one)."""

    def stream(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        streaming: bool = True,
        **option_fields: Any,
    ) -> Any: ...

    async def generate(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        **option_fields: Any,
    ) -> GenerationResult: ...

    async def stop(self, request_key: str, request_id: str = "") -> bool: ...

    async def ready(self) -> bool: ...

    async def aclose(self) -> None: ...


class ReplicaStream:
    """One engine request on one replica that has answered at least once."""

    def __init__(self, stream: Any, first: StreamEvent) -> None:
        self._stream = stream
        self.first = first
        self._pending: asyncio.Future[StreamEvent] | None = None

    @property
    def request_key(self) -> str:
        return self._stream.request_key

    @property
    def request_id(self) -> str:
        return self._stream.request_id

    async def rest(self, silence_s: float = 0.0) -> AsyncIterator[StreamEvent]:
        """The events after the first; raises UpstreamFailure when the engine
        request broke off (the client library ends such a stream quietly), and
        UpstreamStalled when nothing came for `silence_s` (0: no bound
        but the client library's token timeout). A stalled stream's pending
        read is kept until aclose(): cancelling it runs the client library's
        clean-up (close, stop by key), which may wait on the frozen replica."""
        if self.first.final:
            return
        events = self._stream.__aiter__()
        try:
            while True:
                self._pending = asyncio.ensure_future(events.__anext__())
                done, _ = await asyncio.wait({self._pending}, timeout=silence_s or None)
                if not done:
                    UPSTREAM_ERRORS.labels(kind="stall").inc()
                    raise UpstreamStalled(f"the engine sent nothing for {silence_s:.0f} s")
                pending, self._pending = self._pending, None
                yield pending.result()
        except StopAsyncIteration:
            pass
        except ClientTimeoutError as exc:
            UPSTREAM_ERRORS.labels(kind="timeout").inc()
            raise UpstreamFailure(f"the engine stopped answering ({exc})") from None
        except RequestError as exc:
            UPSTREAM_ERRORS.labels(kind="stream").inc()
            raise UpstreamFailure("the engine request failed") from exc
        result = self._stream.result
        if result.error is not None:
            UPSTREAM_ERRORS.labels(kind="stream").inc()
            log.warning("engine request %s broke off: %s", self.request_id, result.error)
            raise UpstreamFailure("the engine request failed")

    async def aclose(self) -> None:
        """Idempotent. Before the final response this closes the gRPC stream and
        (the client library does it) sends `stop` with the request key."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await self._stream.aclose()


class ReplicaClient:
    """One replica's way in: its client, and the Upstream interface for that replica alone."""

    def __init__(self, grpc_url: str = "127.0.0.1:8001", client: StreamingClient | None = None) -> None:
        self.client: StreamingClient = client or AsyncLLMClient(client_config(grpc_url))

    async def start(
        self, model: str, text_input: str, options: GenerationOptions, streaming: bool = True
    ) -> ReplicaStream:
        """Send one engine request and wait for its first response, so that a
        refusal is still an HTTP status and not an error inside a 200 stream.
        `streaming=False`: one response with the whole answer."""
        stream = self.client.stream(text_input, options, model=model, streaming=streaming)
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            await stream.aclose()
            raise GatewayError(502, "The engine ended the request without an answer.", code="upstream_error") from None
        except BaseException as exc:
            await stream.aclose()
            if isinstance(exc, Exception):
                raise map_error(exc) from None
            raise
        return ReplicaStream(stream, first)

    async def aclose(self) -> None:
        await self.client.aclose()
