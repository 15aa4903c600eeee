"""The gateway's FastAPI application: routes, error shape, request context.

Layers, outermost first: the request context (ids, trace, access log,
metrics, echoed headers) → Triton's error shape under /v2 → the body guard
(ASGI: size, media type, nesting) → FastAPI (authentication, validation, the
handlers). Every refusal, from any layer, is OpenAI's error shape, but under
/v2 (Triton's own protocol, gateway/triton/) Triton's `{"error": "..."}`.
The lifespan also runs the gRPC door (KServe v2) in the same event loop."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .bodies.guard import ASGIApp, BodyGuard, Message, Receive, Scope, Send
from .config import GatewayConfig
from .core.errors import GatewayError
from .core.policy import Policy
from .degrade import DegradingPolicy, build_degradation
from .fleet import build_fleet
from .fleet.replica_client import ReplicaClient
from .lifecycle.drain import DrainGuard, DrainState
from .openai.fields import MODEL_NOT_FOUND
from .openai.openapi import allowed_methods, published_schema
from .openai.responses_routes import router as responses_router
from .openai.routes import router as openai_router
from .ops import logs
from .ops.metrics import IN_FLIGHT, REGISTRY, REQUEST_DURATION, REQUESTS
from .ops.server import create_ops_app
from .streams import StreamRegistry
from .streams.routes import router as streams_router
from .triton.grpc_door import start_door
from .triton.http_routes import route_label as triton_route
from .triton.http_routes import router as triton_router
from .triton.responses import TritonErrorShape, is_triton_path

access_log = logging.getLogger("gateway.access")

# the routes metrics are labelled by; anything else is "other", so that random
# paths cannot create label values
_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/health": "health",
}


def build_policy(config: GatewayConfig) -> Policy:
    """The access policy the deployment runs: API keys, tiers, limits."""
    from .admission.access import AccessPolicy

    return AccessPolicy(config, registry=REGISTRY)


def build_streams(config: GatewayConfig) -> StreamRegistry:
    """The resumable streams; shared through Redis when the deployment has one."""
    shared = None
    if config.redis_url:
        from .streams.shared import SharedStreams  # imported here: it brings the Redis client

        shared = SharedStreams.from_url(config.redis_url)
    return StreamRegistry(config, shared)


def _route(path: str) -> str:
    if path.startswith("/v1/models/"):
        return "models"
    if path.startswith("/v1/streams/"):
        return "streams"
    if path == "/v1/responses" or path.startswith("/v1/responses/"):
        return "responses"
    return triton_route(path) or _ROUTES.get(path, "other")


class RequestContextMiddleware:
    """Ids and trace context per request, echoed in the response headers
    (`x-request-id`: the caller's if it sent one, else the gateway's;
    `traceparent`: the gateway's span in the caller's trace), the access log
    line and the request metrics, however the request ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope["headers"]}
        context = logs.new_context(
            headers.get(b"x-request-id", b"").decode("latin-1") or None,
            headers.get(b"traceparent", b"").decode("latin-1") or None,
        )
        context.route = _route(scope["path"])
        token = logs.bind(context)
        status = 500
        echoed = [
            (b"x-request-id", (context.caller_request_id or context.request_id).encode()),
            (b"traceparent", context.traceparent.encode()),
        ]

        status_sent: int | None = None
        answered = False  # the whole response went out

        async def send_with_ids(message: Message) -> None:
            nonlocal status, status_sent, answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            if message["type"] == "http.response.start":
                status = status_sent = message["status"]
                message["headers"] = list(message.get("headers", [])) + echoed
            await send(message)

        in_flight = IN_FLIGHT.labels(route=context.route)
        in_flight.inc()
        try:
            await self.app(scope, receive, send_with_ids)
        except Exception as exc:
            # Starlette re-raises what its 500 handler answered in full, for the
            # server's sake; uvicorn would then close the connection and reset a
            # keep-alive client's next request. A body cut short still goes up:
            # the closed connection is how its client learns it is incomplete.
            if status_sent is not None and not answered:
                raise
            if status_sent is None:
                logging.getLogger("gateway").exception("unhandled error", exc_info=exc)
                await _internal_error(scope, send_with_ids)
        finally:
            in_flight.dec()
            duration = time.perf_counter() - context.started_s
            REQUESTS.labels(route=context.route, tier=context.tier, status=str(status)).inc()
            REQUEST_DURATION.labels(route=context.route).observe(duration)
            if context.route not in ("metrics", "health"):
                access_log.info(
                    "%s %s %d",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={
                        "fields": {
                            "status": status,
                            "route": context.route,
                            "tier": context.tier,
                            "key_id": context.key_id,
                            "duration_ms": round(duration * 1000, 2),
                            "traceparent": context.traceparent,
                            **context.fields,
                        }
                    },
                )
            logs.unbind(token)


async def _internal_error(scope: Scope, send: Send) -> None:
    """A 500 from outside the app's handlers, in the route's error shape."""
    error = GatewayError(500, "Internal error.", code="internal_error")
    body = {"error": error.message} if is_triton_path(scope["path"]) else error.body()
    await JSONResponse(body, status_code=500)(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers or None)


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _validation_error(exc: RequestValidationError) -> GatewayError:
    errors = exc.errors()
    first: dict[str, Any] = errors[0] if errors else {}
    # without "body" and the union members pydantic names ("str", "list[TextPart]")
    location = [
        part
        for part in first.get("loc", ())
        if part != "body" and part not in _UNION_TAGS and not (isinstance(part, str) and "[" in part)
    ]
    # the parameter as OpenAI names it: messages[0].content
    # ("" for a field whose name is empty: `{"": 1}`)
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in location).lstrip(".") if location else None
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        named = param or '"" (an empty name)'
        return GatewayError(
            400, f"Unrecognized request argument supplied: {named}", param=param, code="unrecognized_parameter"
        )
    # not an object at all; a field that should be one is named like any other
    if kind == "json_invalid" or (kind in ("model_attributes_type", "model_type", "missing") and not location):
        return GatewayError(400, "The body must be a JSON object (OpenAI request format).", code="invalid_json")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == MODEL_NOT_FOUND:  # a name not served: 404, as OpenAI answers it
        return GatewayError(404, message, param="model", code="model_not_found")
    return GatewayError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def create_app(
    config: GatewayConfig, policy: Policy, upstream: ReplicaClient | None = None, streams: StreamRegistry | None = None
) -> FastAPI:
    """`upstream`: a single replica's (tests); else the replicas of the settings."""
    streams = streams or build_streams(config)
    fleet = build_fleet(config, upstream)
    drain = DrainState()
    drain.on_drain.append(streams.expire_unread)  # no drain waits out a hung-up stream's grace period
    # under sustained overload the levels apply where every door passes: the
    # policy (caps, shedding, one-piece streams) and the fleet (fallback model)
    degradation = build_degradation(config)
    served: Policy = policy
    if degradation is not None:
        degradation.attach(fleet)
        served = DegradingPolicy(policy, degradation)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Triton's gRPC protocol (KServe v2) in this event loop, with this policy and upstream
        door = await start_door(config, served, fleet, drain)
        fleet.start_loops()  # health and load before the first request
        yield
        if door is not None:
            await door.stop()  # requests in flight get a grace period, then are stopped
        await streams.aclose()  # stops the running streams' engine requests
        await fleet.aclose()
        closer = getattr(policy, "aclose", None)
        if closer is not None:
            await closer()

    app = FastAPI(title="triton-llm-stack gateway", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
    # generated from the request models, with this deployment's gateway.limits.max_n (openai/openapi.py)
    # type-ignored below: FastAPI's documented way to publish a custom schema: replace app.openapi
    app.openapi = lambda: published_schema(app, config.limits.max_n)  # type: ignore[method-assign]
    # every route reaches Triton through the fleet (the doors see it as core.upstream.Upstream):
    # routing, health, failover
    app.state.config, app.state.policy, app.state.fleet = config, served, fleet
    app.state.streams, app.state.drain = streams, drain
    app.state.degradation = degradation
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(streams_router)
    app.include_router(triton_router)

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "Not found." if exc.status_code == 404 else str(exc.detail)
        headers = dict(exc.headers or {})
        allow = allowed_methods(app, request.url.path) if exc.status_code == 405 else None
        if allow:  # every method served at the path, as RFC 9110 asks
            headers["Allow"] = allow
        return _error_response(GatewayError(exc.status_code, message, headers=headers))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logging.getLogger("gateway").exception("unhandled error", exc_info=exc)
        return _error_response(GatewayError(500, "Internal error.", code="internal_error"))

    @app.get("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        # readiness: a draining gateway is taken out of rotation first
        if drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "replicas_routable": len(fleet.routable())})

    # Triton's error shape under /v2, whichever layer refused (the guard too)
    guarded = TritonErrorShape(BodyGuard(app, config.limits.max_body_bytes, config.limits.max_json_depth))
    app.state.asgi = RequestContextMiddleware(DrainGuard(guarded, drain))
    # /metrics and /admin/* only on the ops listener (ops/server.py), never on this public app
    app.state.ops_asgi = create_ops_app(app)
    return app


def asgi_app(config: GatewayConfig, policy: Policy | None = None, upstream: ReplicaClient | None = None) -> ASGIApp:
    """The public stack as one ASGI callable (what the public uvicorn serves; the ops
    endpoints are `create_app(...).state.ops_asgi`, served by ops/server.py)."""
    app = create_app(config, policy or build_policy(config), upstream)
    return app.state.asgi
