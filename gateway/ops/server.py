"""The operational listener: `GET /metrics` (the gateway's Prometheus registry,
per-key labels included) and `/admin/*` (behind the admin key, admin.py), on
`gateway.ops_host:ops_port` (loopback by default), never on the public port,
which answers 404 there.

The same process and event loop as the public server, so both read the same
registry, fleet and degradation state. The ops socket is bound before
anything starts (a taken port stops the gateway at once, naming the setting),
and the ops server stops after the public one has drained and shut down, so
Prometheus sees the whole drain (`gateway_draining`) and an operator can
still look at the replicas meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import GatewayConfig
from ..core.errors import GatewayError
from .admin import router as admin_router
from .metrics import exposition

log = logging.getLogger(__name__)

# a scrape or an admin call in progress at the stop gets this long
_STOP_GRACE_S = 5


class OpsBindError(RuntimeError):
    pass


def create_ops_app(public: FastAPI) -> FastAPI:
    """The ops endpoints over the public app's state (config, fleet, degradation,
    the admin key once read): one source of truth for both listeners."""
    app = FastAPI(title="triton-llm-stack gateway (ops)", openapi_url=None, docs_url=None, redoc_url=None)
    app.state = public.state
    app.include_router(admin_router)

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = exposition()
        return Response(body, media_type=content_type)

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = GatewayError(exc.status_code, "Not found." if exc.status_code == 404 else str(exc.detail))
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on the ops listener", exc_info=exc)
        error = GatewayError(500, "Internal error.", code="internal_error")
        return JSONResponse(error.body(), status_code=500)

    return app


def bind(host: str, port: int) -> socket.socket:
    """The ops socket, bound now: a port already taken is a clear start failure
    instead of uvicorn's bare errno inside the running loop."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)  # SO_REUSEADDR, as uvicorn
    except OSError as exc:
        raise OpsBindError(
            f"the ops listener (metrics, admin) cannot listen on {host}:{port}: {exc.strerror or exc}; "
            f"set gateway.ops_port (0 turns it off) or gateway.ops_host"
        ) from None


class OpsServer(uvicorn.Server):
    """uvicorn on a socket bound beforehand, without signal handlers of its own:
    the public server owns SIGINT / SIGTERM (its drain) and stops this one after it."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket) -> None:
        super().__init__(config)
        self.socket = sock

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def ops_server(config: GatewayConfig, public: FastAPI) -> OpsServer | None:
    """The ops server for `create_app`'s app (its `state.ops_asgi`); None with gateway.ops_port = 0."""
    if not config.ops_port:
        log.warning("the ops listener is off (gateway.ops_port = 0): no /metrics, no /admin")
        return None
    sock = bind(config.ops_host, config.ops_port)
    log.info("ops listener (/metrics, /admin/*) on %s:%d", config.ops_host, config.ops_port)
    return OpsServer(
        uvicorn.Config(
            public.state.ops_asgi,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=_STOP_GRACE_S,
        ),
        sock,
    )


async def serve_together(public: uvicorn.Server, ops: OpsServer | None) -> None:
    """The public server with the ops one beside it in this loop: the ops one
    listens first (its socket is already bound) and stops last."""
    if ops is None:
        await public.serve()
        return
    task = asyncio.create_task(ops.serve(sockets=[ops.socket]))
    try:
        await public.serve()
    finally:
        ops.should_exit = True
        await task
