"""Triton's HTTP protocol through the gateway, for the public models only:
`generate`, `generate_stream` (SSE, resumable), KServe v2 `infer` (JSON and
the binary-data extension, so `tritonclient.http` works unchanged), health,
server and model metadata, the model configuration. Triton's admin,
repository, shared-memory, trace, logging and statistics APIs are simply not
served (404).

Order of a generation request, as on the OpenAI routes, cheapest refusal
first: body guards (ASGI, before this), authentication (401), every input
validated (400), model served (404) and allowed for the tier (403), admission
under the limits (429), then the engine request, whose refusals (400, 503)
still come before the answer starts. Errors are Triton's `{"error": "..."}`
(responses.TritonErrorShape rewrites the app's own handlers' answers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ..core.authentication import authenticated
from ..core.errors import GatewayError
from ..core.policy import Caller
from ..core.upstream import UpstreamFailure
from ..ops import logs
from ..streams import serve_resumable
from . import body_json, calls, metadata
from .inputs import ValidatedCall, validate
from .outputs import check_requested, generate_json, infer_json, output_names, visible
from .responses import Answer, WholeAnswer, dumps, error_event, sse
from .wire_json import generate_inputs, infer_body, split_body

router = APIRouter(include_in_schema=False)  # the OpenAPI schema describes the OpenAI API

_GENERATE_REFUSES_STREAM = "must be false on generate, which answers once (stream with generate_stream)"
_INFER_REFUSES_STREAM = (
    "must be false on infer, which answers once (stream with generate_stream or gRPC ModelStreamInfer)"
)
# generation route → the label of its metrics (and of app._route)
ROUTES = {"generate": "generate", "generate_stream": "generate_stream", "infer": "infer"}


def route_label(path: str) -> str | None:
    """The metrics label of a /v2 path (bounded: anything unknown is
    "triton_other"), None outside /v2."""
    if path != "/v2" and not path.startswith("/v2/"):
        return None
    if path.startswith("/v2/health/"):
        return "health"
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if path.startswith("/v2/models/") and last in ROUTES:
        return ROUTES[last]
    return "triton_metadata" if path == "/v2" or path.startswith("/v2/models/") else "triton_other"


def _request_id() -> str:
    context = logs.current()
    return context.request_id if context else logs.new_request_id()


async def _json(request: Request, raw: bytes | None = None) -> Any:
    raw = await request.body() if raw is None else raw
    return body_json.parse(raw)


async def _admitted(request: Request, caller: Caller, call: ValidatedCall, version: str, route: str) -> calls.Call:
    calls.check_model(request.app.state.policy, caller, call.model, version)
    return await calls.admit(request.app.state.policy, request.app.state.fleet, caller, call, route=route)


def _whole(admitted: calls.Call, render: Any) -> WholeAnswer:
    """The whole answer, computed while the caller waits: start, the one
    response, rendered by `render(event) -> Answer`."""

    async def compute() -> Answer:
        outcome = "cancelled"
        try:
            await admitted.start()
            answer = render(await admitted.whole())
            outcome = "ok"
            return answer
        except UpstreamFailure as exc:
            outcome = "upstream_error"
            raise GatewayError(502, f"The engine request failed: {exc}", code="upstream_error") from None
        except GatewayError:
            outcome = "refused"
            raise
        finally:
            await asyncio.shield(admitted.finish(outcome))

    return WholeAnswer(compute, headers=admitted.admission.headers)


@router.post("/v2/models/{model}/generate")
@router.post("/v2/models/{model}/versions/{version}/generate")
async def generate(model: str, request: Request, version: str = "") -> Response:
    caller = await authenticated(request)
    inputs, caller_id = generate_inputs(await _object(request))
    call = validate(
        model,
        inputs,
        tier=caller.tier,
        request_id=_request_id(),
        caller_id=caller_id,
        stream_refusal=_GENERATE_REFUSES_STREAM,
    )
    admitted = await _admitted(request, caller, call, version, "generate")
    return _whole(
        admitted, lambda event: Answer(dumps(generate_json(model, visible(call, event.outputs), call.caller_id)))
    )


@router.post("/v2/models/{model}/generate_stream")
@router.post("/v2/models/{model}/versions/{version}/generate_stream")
async def generate_stream(model: str, request: Request, version: str = "") -> Response:
    caller = await authenticated(request)
    inputs, caller_id = generate_inputs(await _object(request))
    call = validate(model, inputs, tier=caller.tier, request_id=_request_id(), caller_id=caller_id)
    admitted = await _admitted(request, caller, call, version, "generate_stream")

    async def produce() -> AsyncIterator[bytes]:
        # a GatewayError before the first event is the HTTP answer (serve_resumable)
        outcome = "cancelled"
        try:
            await admitted.start()
            async for event in admitted.events():
                yield sse(generate_json(model, visible(call, event.outputs), call.caller_id))
            outcome = "ok"
        except UpstreamFailure as exc:
            outcome = "upstream_error"
            yield error_event(GatewayError(502, f"The engine request failed mid-stream: {exc}", code="upstream_error"))
        finally:
            # shielded: an expired or deleted stream cancels this, and the engine
            # request must still be stopped and the admission released
            await asyncio.shield(admitted.finish(outcome))

    return await serve_resumable(request, caller, produce, error_event=error_event, headers=admitted.admission.headers)


@router.post("/v2/models/{model}/infer")
@router.post("/v2/models/{model}/versions/{version}/infer")
async def infer(model: str, request: Request, version: str = "") -> Response:
    caller = await authenticated(request)
    head, binary = split_body(await request.body(), request.headers.get("inference-header-content-length"))
    decoded = infer_body(await _json(request, head), binary)
    call = validate(
        model,
        decoded.inputs,
        tier=caller.tier,
        request_id=_request_id(),
        caller_id=decoded.caller_id,
        stream_refusal=_INFER_REFUSES_STREAM,
    )
    check_requested(model, decoded.requested)
    admitted = await _admitted(request, caller, call, version, "infer")
    binary_names = decoded.binary_outputs
    if decoded.requested is None and decoded.all_binary:
        binary_names = set(output_names(model))

    def render(event: Any) -> Answer:
        header, data = infer_json(model, visible(call, event.outputs, decoded.requested), call.caller_id, binary_names)
        body = dumps(header)
        if not any("parameters" in tensor for tensor in header["outputs"]):
            return Answer(body)
        return Answer(
            body + data,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(body))},
        )

    return _whole(admitted, render)


async def _object(request: Request) -> dict[str, Any]:
    body = await _json(request)
    if not isinstance(body, dict):
        raise GatewayError(400, "The body must be a JSON object (Triton's generate request).")
    return body


@router.get("/v2/health/live")
@router.get("/v2/health/ready")
async def health() -> Response:
    # open, like /health: probes carry no key. Ready means the gateway serves;
    # an unreachable Triton answers each request with 503 + Retry-After.
    return Response(status_code=200)


@router.get("/v2")
async def server_metadata(request: Request) -> JSONResponse:
    await authenticated(request)
    return JSONResponse(metadata.server_json())


async def _model_for(request: Request, model: str, version: str) -> None:
    caller = await authenticated(request)
    calls.check_model(request.app.state.policy, caller, model, version)


@router.get("/v2/models/{model}")
@router.get("/v2/models/{model}/versions/{version}")
async def model_metadata(model: str, request: Request, version: str = "") -> JSONResponse:
    await _model_for(request, model, version)
    return JSONResponse(metadata.model_json(model))


@router.get("/v2/models/{model}/ready")
@router.get("/v2/models/{model}/versions/{version}/ready")
async def model_ready(model: str, request: Request, version: str = "") -> Response:
    await _model_for(request, model, version)
    return Response(status_code=200)


@router.get("/v2/models/{model}/config")
@router.get("/v2/models/{model}/versions/{version}/config")
async def model_config(model: str, request: Request, version: str = "") -> JSONResponse:
    await _model_for(request, model, version)
    return JSONResponse(metadata.config_json(model))
