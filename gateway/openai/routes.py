"""`/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Order of a generation request, cheapest refusal first: body guards (ASGI,
before this), authentication (401), body validation (400), model known (404)
and allowed for the tier (403), `n` bound (400), admission under the limits
(429), then the engine requests, whose refusals (400, 503) still come before
the response starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from ..config import TierConfig
from ..core.authentication import authenticated
from ..core.engine_request import BYTES_PER_TOKEN_BOUND, UpstreamRequest
from ..core.errors import GatewayError
from ..core.generation import Generation
from ..core.hangup import HungUp, unless_hung_up
from ..core.policy import Admission, Caller
from ..core.upstream import PUBLIC_MODELS, Upstream
from ..ops import logs
from ..streams.serve import CLIENT_CLOSED_REQUEST, serve_resumable
from .body import OpenAIRoute
from .chunks import ChatFormat, CompletionFormat, Format
from .fields import ServedModel
from .schemas import ChatCompletionRequest, CompletionRequest, _Sampling
from .serve import Job, error_event, produce_stream, whole
from .translate import chat_upstream, completion_upstream, prompt_bytes

# the bodies are read by body.parse_body: a 400 naming the field for what JSON cannot carry
router = APIRouter(route_class=OpenAIRoute)

_MODELS_CREATED = 1_700_000_000  # a fixed `created`: the models have no creation date worth reporting

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "invalid request (OpenAI error shape)"},
    401: {"description": "missing or wrong API key"},
    403: {"description": "model not allowed for the tier"},
    404: {"description": "unknown model"},
    413: {"description": "body too large"},
    415: {"description": "not application/json"},
    429: {"description": "rate limited"},
    503: {"description": "engine overloaded or unreachable; see Retry-After"},
    504: {"description": "the engine timed out: no first token in time, or the caller's token_timeout_ms"},
}


def check_model(request: Request, caller: Caller, model: str) -> None:
    if model not in PUBLIC_MODELS:
        raise GatewayError(
            404,
            f"The model '{model}' does not exist; models are {', '.join(PUBLIC_MODELS)}.",
            param="model",
            code="model_not_found",
        )
    request.app.state.policy.check_model(caller, model)


async def _run(
    request: Request,
    caller: Caller,
    body: _Sampling,
    fmt: Format,
    prefix: str,
    upstream_of: Callable[[Any, TierConfig, int, str], list[UpstreamRequest]],
    with_logprobs: bool,
) -> Response:
    context = logs.current()
    request_id = context.request_id if context else logs.new_request_id()
    check_model(request, caller, body.model)
    config = request.app.state.config
    upstream_requests = upstream_of(body, caller.tier, config.limits.max_n, request_id)
    if context is not None:
        context.fields.update(
            model=body.model,
            stream=bool(body.stream),
            n=len(upstream_requests),
            user=logs.hashed(body.user or getattr(body, "safety_identifier", None)),
            upstream_ids=[r.options.request_id for r in upstream_requests],
        )
    estimate = prompt_bytes(upstream_requests) // BYTES_PER_TOKEN_BOUND
    admission = await request.app.state.policy.admit(caller, estimate)
    upstream: Upstream = request.app.state.fleet
    generation = Generation(
        upstream,
        body.model,
        upstream_requests,
        admission,
        route=fmt.object,
        started_s=context.started_s if context else time.perf_counter(),
        prompt_estimate=estimate,
        keep_logprobs=with_logprobs and not body.stream,
        streamed=bool(body.stream),
        # one piece (degradation): the engine sends the whole answer at once
        streaming=not (body.stream and caller.one_piece),
    )
    job = Job(
        fmt=fmt,
        response_id=f"{prefix}-{request_id}",
        model=body.model,
        caller=caller,
        admission=admission,
        generation=generation,
        with_logprobs=with_logprobs,
        include_usage=body.include_usage,
    )
    if body.stream:
        # resumable: the response id is the stream id (GET /v1/streams/{id})
        return await serve_resumable(
            request,
            caller,
            lambda: produce_stream(job),
            error_event=error_event,
            headers=admission.headers,
            stream_id=job.response_id,
        )
    if not await start_whole(generation, admission, request):
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return whole(job)


@router.post("/v1/chat/completions", responses=_ERRORS)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, caller: Caller = Depends(authenticated)
) -> Response:
    return await _run(request, caller, body, ChatFormat, "chatcmpl", chat_upstream, bool(body.logprobs))


@router.post("/v1/completions", responses=_ERRORS)
async def completions(body: CompletionRequest, request: Request, caller: Caller = Depends(authenticated)) -> Response:
    return await _run(request, caller, body, CompletionFormat, "cmpl", completion_upstream, body.wants_logprobs)


async def start_whole(generation: Generation, admission: Admission, request: Request) -> bool:
    """Send a whole answer's engine requests and wait for their first answers
    (queueing + prefill, possibly long) unless the caller hangs up first:
    False then, the engine requests stopped and the admission released;
    a refusal is raised, the admission released too."""
    try:
        await unless_hung_up(generation.start(), request.receive)
    except HungUp:
        await admission.release()
        return False
    except BaseException:
        await admission.release()
        raise
    return True


def _model_card(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": _MODELS_CREATED, "owned_by": "triton-llm-stack"}


def _visible(caller: Caller) -> list[str]:
    allowed = caller.tier.allowed_models
    return [m for m in PUBLIC_MODELS if not allowed or m in allowed]


@router.get("/v1/models", responses=_ERRORS)
async def list_models(caller: Caller = Depends(authenticated)) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [_model_card(m) for m in _visible(caller)]})


@router.get("/v1/models/{model}", responses=_ERRORS)
async def get_model(model: ServedModel, caller: Caller = Depends(authenticated)) -> JSONResponse:
    if model not in _visible(caller):
        raise GatewayError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
    return JSONResponse(_model_card(model))
