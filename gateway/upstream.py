"""The one way to Triton: the client library's `AsyncLLMClient` over gRPC
streaming, one client (one HTTP/2 channel) per gateway process.

The gateway mints each engine request's Triton id and the client library its
request key, so a caller can neither collide with nor stop anyone else's
request. Upstream failures become GatewayErrors with the status a caller can
act on: 400 for input the text stages refused, 503 + Retry-After for an
overloaded engine or an unreachable Triton, 504 for no first token in time."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from client import (
    AsyncLLMClient,
    ClientConfig,
    ClientTimeoutError,
    FirstTokenTimeoutError,
    GenerationOptions,
    RequestError,
    RetryConfig,
    ServerConnectionError,
    StreamEvent,
    TimeoutConfig,
)
from contract.errors import OVERLOADED_MARKER, parse_refusal
from contract.public_tensors import PUBLIC_INPUTS, PUBLIC_TO_LLM

from .errors import GatewayError
from .metrics import UPSTREAM_ERRORS

log = logging.getLogger(__name__)

PUBLIC_MODELS = ("ensemble", "llm_bls")
# seconds a caller should wait after an overload: the engine's queue drains in
# about one generation's time, and OpenAI SDKs honour the header
OVERLOAD_RETRY_AFTER_S = 1
# the gateway waits this long between two responses of an engine request; a
# caller's own per-token timeout (`token_timeout_ms`, enforced by the engine)
# may be shorter, never longer
UPSTREAM_TOKEN_TIMEOUT_S = 60.0
# public input → the parameter a caller sent
# (its own name, except where OpenAI names it otherwise)
_PARAMS = {spec.name: {"text_input": "prompt", "stop_words": "stop"}.get(spec.name, spec.name)
           for spec in PUBLIC_INPUTS}
# the LLM step's inputs that come from a public one under another name: its
# refusal of one is the caller's input too (a 400), not an engine failure
_PARAMS.update({llm: _PARAMS[public] for public, llm in PUBLIC_TO_LLM.items()})
_PARAMS.update({"input_ids": "prompt", "request_output_len": "max_tokens", "stop_words_list": "stop",
                "stop_words_ids": "stop", "bad_words_list": "bad_words", "bad_words_ids": "bad_words"})


class UpstreamFailure(Exception):
    """The engine request failed after it had started answering."""


class UpstreamStalled(UpstreamFailure):
    """The engine request sent nothing for the stall timeout: its replica may
    be frozen (a hung process, a stopped container), its request still held."""


def client_config(grpc_url: str) -> ClientConfig:
    # No retries here: an overloaded engine answers the caller at once with 503 +
    # Retry-After (its SDK backs off); retrying inside the gateway would hold the
    # request and multiply the load exactly when the engine is full.
    return ClientConfig(url=grpc_url, transport="grpc", model="ensemble",
                        retry=RetryConfig(max_attempts=1),
                        timeouts=TimeoutConfig(first_token_s=300.0, token_s=UPSTREAM_TOKEN_TIMEOUT_S))


def map_error(exc: BaseException) -> GatewayError:
    """A failure before the first response, as the caller's HTTP answer."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, RequestError):
        if OVERLOADED_MARKER in exc.message:
            UPSTREAM_ERRORS.labels(kind="overloaded").inc()
            return GatewayError(503, "The engine is overloaded; retry after the delay in Retry-After.",
                                code="overloaded", headers={"Retry-After": str(OVERLOAD_RETRY_AFTER_S)})
        # the text stages' and the LLM step's refusals of an input (contract.errors)
        refusal = parse_refusal(exc.message, _PARAMS)
        if refusal is not None:
            UPSTREAM_ERRORS.labels(kind="invalid_input").inc()
            return GatewayError(400, refusal.text, param=_PARAMS[refusal.field])
        UPSTREAM_ERRORS.labels(kind="rejected").inc()
        log.warning("upstream refused a request: %s", exc.message)
        return GatewayError(502, "The engine refused the request.", code="upstream_error")
    if isinstance(exc, ServerConnectionError):
        UPSTREAM_ERRORS.labels(kind="connection").inc()
        log.warning("upstream unreachable: %s", exc)
        return GatewayError(503, "The engine is unreachable; retry later.", code="upstream_unavailable",
                            headers={"Retry-After": str(OVERLOAD_RETRY_AFTER_S)})
    if isinstance(exc, FirstTokenTimeoutError):
        UPSTREAM_ERRORS.labels(kind="timeout").inc()
        return GatewayError(504, "The engine did not start answering in time.", code="upstream_timeout")
    UPSTREAM_ERRORS.labels(kind="internal").inc()
    log.exception("unexpected upstream failure", exc_info=exc)
    return GatewayError(500, "Internal error.", code="internal_error")


class StreamingClient(Protocol):
    def stream(self, text_input: str = "", options: GenerationOptions | None = None, *,
               model: str | None = None, streaming: bool = True, **option_fields: Any) -> Any: ...

    async def aclose(self) -> None: ...


class UpstreamStream:
    """One engine request that has answered at least once."""

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


class Upstream:
    def __init__(self, grpc_url: str = "127.0.0.1:8001", client: StreamingClient | None = None) -> None:
        self.client: StreamingClient = client or AsyncLLMClient(client_config(grpc_url))

    async def start(self, model: str, text_input: str, options: GenerationOptions,
                    streaming: bool = True) -> UpstreamStream:
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
        return UpstreamStream(stream, first)

    async def aclose(self) -> None:
        await self.client.aclose()
