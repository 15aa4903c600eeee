"""gRPC requests observed like the HTTP ones (app.RequestContextMiddleware
does that for HTTP): the gateway's ids and the caller's trace context (from
the `x-request-id` / `traceparent` metadata), the request metrics and one
access log line, with an HTTP-like status (200, the refusal's 4xx/5xx, 499
when the caller cancelled) so dashboards read both doors alike."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from ..ops import logs
from ..ops.metrics import IN_FLIGHT, REQUEST_DURATION, REQUESTS
from .responses import CLIENT_CLOSED_REQUEST

access_log = logging.getLogger("gateway.access")


@dataclass
class Observation:
    context: logs.LogContext
    status: int = 200


def metadata_of(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's metadata, keys lower-case (gRPC sends them so), text values only."""
    return {key.lower(): value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}


@contextmanager
def observed(route: str, method: str, metadata: Mapping[str, str]) -> Iterator[Observation]:
    """Bind a request context for the block; `observation.status` is what
    the handler answered (set it before aborting)."""
    context = logs.new_context(metadata.get("x-request-id"), metadata.get("traceparent"))
    context.route = route
    token = logs.bind(context)
    observation = Observation(context)
    in_flight = IN_FLIGHT.labels(route=route)
    in_flight.inc()
    try:
        yield observation
    except asyncio.CancelledError:
        observation.status = CLIENT_CLOSED_REQUEST
        raise
    except Exception:
        if observation.status < 400:
            observation.status = 500
        raise
    finally:
        in_flight.dec()
        duration = time.perf_counter() - context.started_s
        REQUESTS.labels(route=route, tier=context.tier, status=str(observation.status)).inc()
        REQUEST_DURATION.labels(route=route).observe(duration)
        access_log.info(
            "gRPC %s %d",
            method,
            observation.status,
            extra={
                "fields": {
                    "status": observation.status,
                    "route": route,
                    "tier": context.tier,
                    "key_id": context.key_id,
                    "duration_ms": round(duration * 1000, 2),
                    "traceparent": context.traceparent,
                    **context.fields,
                }
            },
        )
        logs.unbind(token)
