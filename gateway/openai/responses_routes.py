"""OpenAI's Responses API, text in and text out: `POST /v1/responses` (whole,
streamed, or in the background), `GET /v1/responses/{id}` (the response
object; with `stream=true&starting_after=N`, its events after sequence number
N, then the live ones: the `openai` SDK's own resume,
`client.responses.retrieve(id, stream=True, starting_after=N)`), and
`POST /v1/responses/{id}/cancel`.

A streamed or background response is a resumable stream (gateway/streams/)
whose id is the response id, so `GET /v1/streams/{id}` with `Last-Event-ID:
N+1` reads the same events. A background response runs to its end whether or
not anyone reads, and stays readable for `gateway.streams.response_retention_s`; a
plain streamed one has the tier's grace period, like the chat streams."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from client import GenerationOptions

from ..core.authentication import authenticated
from ..core.engine_request import BYTES_PER_TOKEN_BOUND, UpstreamRequest, capped_max_tokens
from ..core.errors import GatewayError
from ..core.generation import Generation, engine_failure
from ..core.policy import Caller
from ..core.upstream import UpstreamFailure
from ..ops import logs
from ..streams import serve
from ..streams.serve import CLIENT_CLOSED_REQUEST, registry_of, serve_resumable
from .body import OpenAIRoute
from .chunks import ChatFormat
from .responses_events import ResponseState, error_event
from .responses_schema import ResponseRequest
from .routes import _ERRORS, check_model, start_whole
from .serve import Job, WholeResponse
from .translate import prompt_bytes

router = APIRouter(route_class=OpenAIRoute)  # bodies read by body.parse_body, as in routes.py


def _upstream(body: ResponseRequest, caller: Caller, request_id: str) -> UpstreamRequest:
    options = GenerationOptions(
        max_tokens=capped_max_tokens(body.max_output_tokens, caller.tier),
        temperature=body.temperature,
        top_p=body.top_p,
        messages=body.messages(),
        priority=caller.tier.priority,
        token_timeout_ms=body.token_timeout_ms,
        return_output_ids=True,
        request_id=f"{request_id}-0",
    )
    return UpstreamRequest(0, "", options)


@router.post("/v1/responses", responses=_ERRORS)
async def create_response(body: ResponseRequest, request: Request, caller: Caller = Depends(authenticated)) -> Response:
    context = logs.current()
    request_id = context.request_id if context else logs.new_request_id()
    check_model(request, caller, body.model)
    upstream_request = _upstream(body, caller, request_id)
    if context is not None:
        context.fields.update(
            model=body.model,
            stream=bool(body.stream),
            background=bool(body.background),
            user=logs.hashed(body.user or body.safety_identifier),
        )
    estimate = prompt_bytes([upstream_request]) // BYTES_PER_TOKEN_BOUND
    admission = await request.app.state.policy.admit(caller, estimate)
    generation = Generation(
        request.app.state.fleet,
        body.model,
        [upstream_request],
        admission,
        route="response",
        started_s=context.started_s if context else time.perf_counter(),
        prompt_estimate=estimate,
        streamed=bool(body.stream),
        # one piece (degradation): the engine sends the whole answer at once
        streaming=not (body.stream and caller.one_piece),
    )
    job = Job(
        fmt=ChatFormat,
        response_id=f"resp_{request_id}",
        model=body.model,
        caller=caller,
        admission=admission,
        generation=generation,
        with_logprobs=False,
    )
    state = ResponseState(job.response_id, body.model, body)

    def produce() -> AsyncIterator[bytes]:
        return produce_events(job, state)

    if body.background and not body.stream:
        session = registry_of(request).open(caller, produce, _refusal, job.response_id, background=True, summary=state)
        registry_of(request).detach(session)  # nobody reads now: GET /v1/responses/{id} later
        return JSONResponse(state.snapshot(), headers=admission.headers)
    if body.stream:
        return await serve_resumable(
            request,
            caller,
            produce,
            error_event=_refusal,
            headers=admission.headers,
            stream_id=job.response_id,
            background=bool(body.background),
            summary=state,
        )
    if not await start_whole(generation, admission, request):
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return WholeResponse(lambda: whole(job, state), headers=admission.headers)


def _refusal(error: GatewayError) -> bytes:
    return error_event(error.code or "invalid_request_error", error.message)


async def produce_events(job: Job, state: ResponseState) -> AsyncIterator[bytes]:
    """The typed events of one response, from sending the engine request to
    `response.completed` (or `.incomplete` / `.failed`)."""
    try:
        await job.generation.start()
    except BaseException:
        await job.admission.release()
        raise
    outcome = "cancelled"
    try:
        for rendered in state.opening():
            yield rendered
        async for choice, event in job.generation.events():
            failure = engine_failure(choice) if event.finish_reason else None
            if failure is not None:
                outcome = "engine_error"
                yield state.failed(failure.code or "upstream_error", failure.message)
                return
            if event.text:
                yield state.delta(event.text)
        _count(job, state)
        for rendered in state.closing(job.generation.choices[0].engine_finish):
            yield rendered
        outcome = "ok"
    except UpstreamFailure as exc:
        outcome = "upstream_error"
        yield state.failed("upstream_error", f"The engine request failed mid-stream: {exc}")
    finally:
        if outcome == "cancelled":
            state.cancelled()
        await asyncio.shield(job.finish(outcome))


async def whole(job: Job, state: ResponseState) -> tuple[int, dict]:
    outcome = "cancelled"
    try:
        async for _ in job.generation.events():
            pass
        choice = job.generation.choices[0]
        failure = engine_failure(choice)
        if failure is not None:
            outcome = "engine_error"
            return failure.status, failure.body()
        state.text = "".join(choice.text)
        _count(job, state)
        state.finish(choice.engine_finish)
        outcome = "ok"
        return 200, state.snapshot()
    except UpstreamFailure as exc:
        outcome = "upstream_error"
        error = GatewayError(502, f"The engine request failed: {exc}", code="upstream_error")
        return error.status, error.body()
    finally:
        await asyncio.shield(job.finish(outcome))


def _count(job: Job, state: ResponseState) -> None:
    state.input_tokens, state.output_tokens = job.generation.prompt_tokens, job.generation.completion_tokens


@router.get("/v1/responses/{response_id}", responses=_ERRORS)
async def get_response(
    response_id: str,
    request: Request,
    caller: Caller = Depends(authenticated),
    stream: bool = False,
    starting_after: int | None = Query(default=None, ge=-1),
) -> Response:
    """The response object, or (`stream=true`) its events after `starting_after`."""
    if stream:
        # sequence number N is the stream's event N + 1
        after = 0 if starting_after is None else starting_after + 1
        return await serve.resume(request, caller, response_id, after)
    registry = registry_of(request)
    session = registry.find(response_id, caller)
    if session is not None and session.summary is not None:
        return JSONResponse(session.summary.snapshot())
    shared = registry.shared
    if session is None and shared is not None and await serve.owned_by(shared, response_id, caller):
        summary = await shared.summary(response_id)
        # still running in another gateway process: its events are readable here, its object is not yet
        return JSONResponse(summary or {"id": response_id, "object": "response", "status": "in_progress"})
    raise _not_found(response_id)


@router.post("/v1/responses/{response_id}/cancel", responses=_ERRORS)
async def cancel_response(response_id: str, request: Request, caller: Caller = Depends(authenticated)) -> Response:
    """Stop a background response (its engine request is stopped before this answers)."""
    registry = registry_of(request)
    session = registry.find(response_id, caller)
    if session is None or session.summary is None:
        raise _not_found(response_id)
    if not session.background:
        raise GatewayError(400, "Only background responses can be cancelled.", param="response_id")
    registry.cancel(session)
    await session.wait_closed()
    return JSONResponse(session.summary.snapshot())


def _not_found(response_id: str) -> GatewayError:
    return GatewayError(
        404, f"No response with id '{response_id}' for this API key.", param="response_id", code="response_not_found"
    )
