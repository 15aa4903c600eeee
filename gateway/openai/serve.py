"""Serving one admitted generation, streamed (the SSE events of a resumable
stream) or whole, and what happens however it ends: engine requests still
running are stopped (a whole answer's caller that hangs up frees its KV blocks
at once; a stream's, after its grace period), the admission is released, usage
is counted per key and logged."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..core.errors import GatewayError
from ..core.generation import ChoiceState, Generation, engine_failure, event_logprobs
from ..core.hangup import HungUp, unless_hung_up
from ..core.policy import Admission, Caller
from ..core.upstream import UpstreamFailure
from ..core.usage import settle
from . import chunks
from .chunks import Format
from .translate import finish_reason

log = logging.getLogger("gateway.requests")


@dataclass
class Job:
    """One admitted request, ready to answer."""

    fmt: Format
    response_id: str
    model: str
    caller: Caller
    admission: Admission
    generation: Generation
    with_logprobs: bool
    include_usage: bool = False

    def __post_init__(self) -> None:
        self.created = int(time.time())

    async def finish(self, outcome: str) -> None:
        """Idempotent enough to run from any exit path once."""
        await settle(self.generation, self.admission, self.caller, outcome)


def error_event(error: GatewayError) -> bytes:
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


async def produce_stream(job: Job) -> AsyncIterator[bytes]:
    """The stream's SSE events, from sending the engine requests to `[DONE]`:
    the producer of a resumable stream (gateway/streams/), which runs it
    detached from the connection. A refusal before the first event is raised
    (the caller's HTTP status); the admission is released however it ends."""
    try:
        await job.generation.start()
    except BaseException:
        await job.admission.release()
        raise
    async for chunk in _stream_body(job):
        yield chunk


async def _stream_body(job: Job) -> AsyncIterator[bytes]:
    outcome = "cancelled"  # unless the loop below gets to the end
    started: set[int] = set()
    try:
        async for choice, event in job.generation.events():
            failure = engine_failure(choice) if event.finish_reason else None
            if failure is not None:
                outcome = "engine_error"
                yield error_event(failure)
                return
            payload = _delta(job, choice, event, first=choice.index not in started)
            if payload is not None:
                started.add(choice.index)
                yield chunks.sse(
                    chunks.chunk(job.fmt, job.response_id, job.created, job.model, [payload], job.include_usage)
                )
        if job.include_usage:
            yield chunks.sse(
                chunks.usage_chunk(
                    job.fmt,
                    job.response_id,
                    job.created,
                    job.model,
                    job.generation.prompt_tokens,
                    job.generation.completion_tokens,
                )
            )
        yield chunks.SSE_DONE
        outcome = "ok"
    except UpstreamFailure as exc:
        outcome = "upstream_error"
        yield error_event(GatewayError(502, f"The engine request failed mid-stream: {exc}", code="upstream_error"))
    finally:
        # shielded: a caller that hung up cancels this task, and the engine
        # requests must still be stopped and the admission released
        await asyncio.shield(job.finish(outcome))


def _delta(job: Job, choice: ChoiceState, event: Any, first: bool) -> dict[str, Any] | None:
    reason = finish_reason(event.finish_reason) if event.finish_reason else None
    if job.with_logprobs:
        # a streamed choice's token_ids / logprobs hold what no chunk has carried yet
        choice.token_ids.extend(event.output_ids)
        choice.logprobs.extend(event_logprobs(event))
    if not event.text and not first and reason is None:
        return None  # tokens held back by the text stages (a possible stop string, split UTF-8)
    logprobs = None
    if job.with_logprobs:
        logprobs = (choice.token_ids, choice.logprobs)
        choice.token_ids, choice.logprobs = [], []
    return job.fmt.delta(choice, event.text, first, reason, logprobs)


async def whole_body(job: Job) -> tuple[int, dict[str, Any]]:
    outcome = "cancelled"
    try:
        async for _ in job.generation.events():
            pass
        failure = next((f for f in map(engine_failure, job.generation.choices) if f is not None), None)
        if failure is not None:
            outcome = "engine_error"
            return failure.status, failure.body()
        outcome = "ok"
        return 200, chunks.whole(
            job.fmt,
            job.response_id,
            job.created,
            job.model,
            job.generation.choices,
            job.generation.prompt_tokens,
            job.with_logprobs,
        )
    except UpstreamFailure as exc:
        outcome = "upstream_error"
        error = GatewayError(502, f"The engine request failed: {exc}", code="upstream_error")
        return error.status, error.body()
    finally:
        await asyncio.shield(job.finish(outcome))


class WholeResponse(Response):
    """A JSON answer computed while the caller is still there: if it hangs up
    first, the computation is cancelled (and with it the engine requests),
    which FastAPI's plain handlers would not notice."""

    def __init__(self, compute: Callable[[], Awaitable[tuple[int, dict[str, Any]]]], headers: dict[str, str]) -> None:
        super().__init__(status_code=200, headers=headers, media_type="application/json")
        self._compute = compute
        self._given_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, body = await unless_hung_up(self._compute(), receive)
        except HungUp:
            return  # nobody to answer
        self.status_code = status
        self.body = self.render(body)
        self.init_headers(self._given_headers)  # Content-Length of this body
        await super().__call__(scope, receive, send)

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()


def whole(job: Job) -> WholeResponse:
    return WholeResponse(lambda: whole_body(job), headers=job.admission.headers)
