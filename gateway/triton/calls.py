"""One Triton-protocol request from admission to its end, the same behind
every door (HTTP generate / generate_stream / infer, gRPC ModelInfer /
ModelStreamInfer): admitted under the caller's limits with a prompt
estimate, sent through the upstream (the fleet, as core/upstream.py's
`Upstream`) by the core's `Generation` (exact token accounting, TTFT / ITL,
stop by key on close), and however it ends, the engine request stopped, the
admission released and the key's usage counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from client import StreamEvent

from ..core.engine_request import BYTES_PER_TOKEN_BOUND, UpstreamRequest
from ..core.errors import GatewayError
from ..core.generation import Generation
from ..core.policy import Admission, Caller, Policy
from ..core.upstream import Upstream
from ..core.usage import settle
from ..ops import logs
from .inputs import ValidatedCall
from .metadata import check_served


def check_model(policy: Policy, caller: Caller, model: str, version: str = "") -> None:
    """404 for a model the gateway does not serve (Triton's words), 403 for
    one the caller's tier may not use."""
    check_served(model, version)
    policy.check_model(caller, model)


@dataclass
class Call:
    validated: ValidatedCall
    caller: Caller
    admission: Admission
    generation: Generation
    started: bool = False
    finished: bool = False

    async def start(self) -> None:
        """Send the engine request and wait for its first response, so that a
        refusal (the text stages' 400, an overloaded engine's 503) is still the
        caller's answer; on a refusal the admission is released here."""
        try:
            await self.generation.start()
        except BaseException:
            self.finished = True
            await asyncio.shield(self.admission.release())
            raise
        self.started = True

    async def events(self) -> AsyncIterator[StreamEvent]:
        """Every response to the end; UpstreamFailure when the engine request breaks off."""
        async for _, event in self.generation.events():
            yield event

    async def whole(self) -> StreamEvent:
        """The one response of a `stream: false` request."""
        events = [event async for event in self.events()]
        if len(events) != 1:
            raise GatewayError(
                502, f"The engine answered a whole-answer request with {len(events)} responses.", code="upstream_error"
            )
        return events[0]

    async def finish(self, outcome: str) -> None:
        """Idempotent; from any exit path. Shield it where the caller's
        cancellation could interrupt it."""
        if self.finished:
            return
        self.finished = True
        await settle(self.generation, self.admission, self.caller, outcome)


async def admit(policy: Policy, upstream: Upstream, caller: Caller, validated: ValidatedCall, *, route: str) -> Call:
    """Admission under the caller's limits (429 / 503 raised from here);
    nothing is sent upstream yet."""
    context = logs.current()
    started_s = context.started_s if context else time.perf_counter()
    if context is not None:
        context.fields.update(
            model=validated.model, stream=validated.streaming, upstream_ids=[validated.options.request_id]
        )
    estimate = validated.prompt_bytes // BYTES_PER_TOKEN_BOUND
    admission = await policy.admit(caller, estimate)
    generation = Generation(
        upstream,
        validated.model,
        [UpstreamRequest(0, validated.text_input, validated.options)],
        admission,
        route=route,
        started_s=started_s,
        prompt_estimate=estimate,
        streamed=validated.streaming,
        # one piece (degradation): the engine sends the whole answer at once
        streaming=validated.streaming and not caller.one_piece,
    )
    return Call(validated, caller, admission, generation)
