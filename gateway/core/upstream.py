"""The engine behind the gateway as every door sees it: the interface a
door starts engine requests through (`Upstream`, which the fleet implements:
gateway/fleet/), the served models, and what an upstream failure means to a
caller.

Upstream failures become GatewayErrors with the status a caller can act on:
400 for input the text stages refused, 503 + Retry-After for an overloaded
engine or an unreachable Triton, 504 for no first token in time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Protocol

from client import (
    FirstTokenTimeoutError,
    GenerationOptions,
    RequestError,
    ServerConnectionError,
    StreamEvent,
)
from contract.errors import OVERLOADED_MARKER, parse_refusal
from contract.public_tensors import PUBLIC_INPUTS, PUBLIC_TO_LLM

from ..ops.metrics import UPSTREAM_ERRORS
from .errors import GatewayError

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
_PARAMS = {
    spec.name: {"text_input": "prompt", "stop_words": "stop"}.get(spec.name, spec.name) for spec in PUBLIC_INPUTS
}
# the LLM step's inputs that come from a public one under another name: its
# refusal of one is the caller's input too (a 400), not an engine failure
_PARAMS.update({llm: _PARAMS[public] for public, llm in PUBLIC_TO_LLM.items()})
_PARAMS.update(
    {
        "input_ids": "prompt",
        "request_output_len": "max_tokens",
        "stop_words_list": "stop",
        "stop_words_ids": "stop",
        "bad_words_list": "bad_words",
        "bad_words_ids": "bad_words",
    }
)


class UpstreamFailure(Exception):
    """The engine request failed after it had started answering."""


class UpstreamStalled(UpstreamFailure):
    """The engine request sent nothing for the stall timeout: its replica may
    be frozen (a hung process, a stopped container), its request still held."""


def map_error(exc: BaseException) -> GatewayError:
    """A failure before the first response, as the caller's HTTP answer."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, RequestError):
        if OVERLOADED_MARKER in exc.message:
            UPSTREAM_ERRORS.labels(kind="overloaded").inc()
            return GatewayError(
                503,
                "The engine is overloaded; retry after the delay in Retry-After.",
                code="overloaded",
                headers={"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
            )
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
        return GatewayError(
            503,
            "The engine is unreachable; retry later.",
            code="upstream_unavailable",
            headers={"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
        )
    if isinstance(exc, FirstTokenTimeoutError):
        UPSTREAM_ERRORS.labels(kind="timeout").inc()
        return GatewayError(504, "The engine did not start answering in time.", code="upstream_timeout")
    UPSTREAM_ERRORS.labels(kind="internal").inc()
    log.exception("unexpected upstream failure", exc_info=exc)
    return GatewayError(500, "Internal error.", code="internal_error")


class UpstreamStream(Protocol):
    """One engine request that has answered at least once."""

    @property
    def first(self) -> StreamEvent: ...

    def rest(self) -> AsyncIterator[StreamEvent]:
        """The events after the first; UpstreamFailure when the engine request breaks off."""
        ...

    async def aclose(self) -> None:
        """Idempotent; before the final response it stops the engine request."""


class Upstream(Protocol):
    """Where every door's engine requests go (the fleet: routing, health, failover)."""

    async def start(
        self, model: str, text_input: str, options: GenerationOptions, streaming: bool = True
    ) -> UpstreamStream:
        """Send one engine request and wait for its first response, so that a
        refusal is still the caller's answer (a GatewayError) and not an error
        inside a started stream. `streaming=False`: one response with the whole answer."""
        ...
