"""The asyncio client for the public entry points `ensemble` and `llm_bls`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from contract.request_key import mint_request_key

from .config import ClientConfig
from .errors import RequestError
from .grpc_transport import GrpcTransport
from .payload import input_values
from .retry import RetryBudget, Sleep
from .sse_transport import SseTransport
from .stream import GenerationStream, already_finished
from .timing import DEFAULT_CLOCK, Clock
from .transport import Transport
from .types import GenerationOptions, GenerationResult, new_request_id

log = logging.getLogger(__name__)


def make_transport(config: ClientConfig, clock: Clock = DEFAULT_CLOCK, sleep: Sleep = asyncio.sleep) -> Transport:
    if config.transport == "sse":
        return SseTransport(
            config.url,
            config.timeouts,
            config.max_connections,
            clock=clock,
            api_key=config.api_key,
            retry=config.retry,
            sleep=sleep,
        )
    return GrpcTransport(config.url, config.timeouts, clock=clock, api_key=config.api_key)


class AsyncLLMClient:
    """One instance per server: it pools connections and owns the retry budget.

        async with AsyncLLMClient(ClientConfig(url="http://127.0.0.1:8000")) as client:
            async with client.stream("Hello", max_tokens=32) as stream:
                async for event in stream:
                    print(event.text, end="")
            print(stream.result.ttft_s)

    Through the gateway, give its URL and an API key (`ClientConfig.api_key`):
    the key goes with every request, a dropped SSE stream is resumed
    (`result.resumes`), and cancelling (break, `aclose()`, task cancel) stops the
    request with `DELETE /v1/streams/{id}` (SSE) or the RPC's cancel (gRPC).
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        transport: Transport | None = None,
        budget: RetryBudget | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = DEFAULT_CLOCK,
    ) -> None:
        self.config = config or ClientConfig()
        self.clock = clock
        self.sleep = sleep
        self.transport = transport or make_transport(self.config, clock, sleep)
        self.budget = budget or RetryBudget.from_config(self.config.retry)

    @property
    def transport_name(self) -> str:
        return getattr(self.transport, "name", self.config.transport)

    def stream(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        streaming: bool = True,
        **option_fields: Any,
    ) -> GenerationStream:
        """Start a streaming generation (lazily: nothing is sent before iteration).

        Options come as a `GenerationOptions` or as its field names, e.g.
        `client.stream("Hi", max_tokens=16, temperature=0)`. `request_id` and
        `request_key` (the secret that stops the request) are minted per call
        unless given; a given `request_key` must be 32-128 chars of [A-Za-z0-9_-].
        `streaming=False` sends `stream: false`: the server answers once, with
        the whole text (still read through this iterator).
        """
        options = _merge(options, option_fields)
        request_id = options.request_id or new_request_id()
        # Minted here, once per logical request, so that every retry and the stop
        # on cancel carry the same key (GenerationOptions validated a given one).
        request_key = options.request_key or mint_request_key()
        if options.request_key is None:
            options = dataclasses.replace(options, request_key=request_key)
        values = input_values(text_input, options, stream=streaming)
        return GenerationStream(self, model or self.config.model, values, request_id, request_key)

    async def generate(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        **option_fields: Any,
    ) -> GenerationResult:
        """Stream to the end and return the whole result."""
        return await self.stream(text_input, options, model=model, **option_fields).collect()

    async def stop(self, request_key: str, request_id: str = "") -> bool:
        """Stop a running request by its key (Triton directly): True once the
        server has taken the stop, False when it has no live request with this
        key (finished, or never there). Raises RequestError for any other
        refusal, ServerConnectionError when the server cannot be reached."""
        try:
            await self.transport.send_stop(self.config.stop_model, request_id or new_request_id(), request_key)
        except RequestError as exc:
            if already_finished(exc):
                return False
            raise
        return True

    async def ready(self) -> bool:
        """Whether the server is ready to serve (gRPC `ServerReady`, SSE
        `GET /v2/health/ready`): False when it is not, cannot be reached, or does
        not answer within `timeouts.connect_s`. Never raises for those; for
        health checks and routing."""
        return await self.transport.ready(self.config.timeouts.connect_s)

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncLLMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _merge(options: GenerationOptions | None, option_fields: dict[str, Any]) -> GenerationOptions:
    if options is None:
        return GenerationOptions(**option_fields)
    return dataclasses.replace(options, **option_fields) if option_fields else options
