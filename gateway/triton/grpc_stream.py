"""ModelStreamInfer through the gateway: one bidirectional stream carries any
number of requests, each run concurrently as its own task (validated,
admitted, sent upstream, its responses written back as they come), as Triton
does. Each response carries `triton_final_response`; a refused request
answers one `error_message` naming the input, and the stream goes on.

However the stream ends: the caller half-closes it (the requests in flight
answer to their end, then the RPC ends), cancels it (every request in flight
is closed upstream, which sends `stop` with its request key, so the KV blocks
are freed at once), or the gateway stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
from tritonclient.grpc import service_pb2

from ..core.errors import GatewayError
from ..core.policy import Caller
from ..core.upstream import UpstreamFailure
from . import calls
from .grpc_observe import metadata_of, observed
from .outputs import infer_proto, visible
from .wire_proto import validated_request

if TYPE_CHECKING:
    from .grpc_door import TritonDoor

log = logging.getLogger(__name__)
Response: TypeAlias = service_pb2.ModelStreamInferResponse
_END = object()


def error_response(error: GatewayError) -> Response:
    return Response(error_message=error.message)


def empty_final(model: str, caller_id: str | None) -> Response:
    """A final flag with no data, for a request whose last response did not say so."""
    return Response(infer_response=infer_proto(model, {}, caller_id, final=True))


async def serve_stream(
    door: TritonDoor, requests: AsyncIterator[service_pb2.ModelInferRequest], context: grpc.aio.ServicerContext
) -> None:
    """The RPC, with grpc.aio's reader/writer API: a coroutine that the
    caller's cancel cancels, so the cleanup below runs at once (a generator
    handler could be left suspended at a `yield` until collected)."""
    caller = await door.authenticate(context)
    metadata = metadata_of(context)
    out: asyncio.Queue[Any] = asyncio.Queue()
    tasks: set[asyncio.Task[None]] = set()

    async def read() -> None:
        try:
            async for request in requests:
                task = asyncio.create_task(_one(door, caller, metadata, request, out.put_nowait))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            # half-closed by the caller: what is in flight answers to its end
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
        finally:
            out.put_nowait(_END)

    reader = asyncio.create_task(read())
    try:
        while (item := await out.get()) is not _END:
            await context.write(item)
        await reader  # raises what reading the requests raised
    finally:
        # the caller cancelled, or the gateway stops: close every request in
        # flight; each one's own cleanup stops its engine request (shielded)
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.shield(asyncio.gather(reader, *tasks, return_exceptions=True))


async def _one(
    door: TritonDoor, caller: Caller, metadata: dict[str, str], request: service_pb2.ModelInferRequest, send: Any
) -> None:
    """One request of the stream, to its end; never raises (its errors are
    the caller's `error_message`)."""
    with observed("grpc_stream", "ModelStreamInfer", metadata) as observation:
        observation.context.tier, observation.context.key_id = caller.tier_name, caller.key_id
        try:
            call, requested = validated_request(caller, request, stream_refusal=None)
            calls.check_model(door.policy, caller, call.model, request.model_version)
            admitted = await calls.admit(door.policy, door.upstream, caller, call, route="grpc_stream")
        except GatewayError as error:
            observation.status = error.status
            send(error_response(error))
            return
        except Exception:
            observation.status = 500
            log.exception("a stream request failed before it was admitted")
            send(error_response(GatewayError(500, "Internal error.")))
            return
        outcome, final = "cancelled", False
        try:
            await admitted.start()
            async for event in admitted.events():
                final = final or event.final
                send(
                    Response(
                        infer_response=infer_proto(
                            call.model, visible(call, event.outputs, requested), call.caller_id, final=event.final
                        )
                    )
                )
            if not final:
                send(empty_final(call.model, call.caller_id))
            outcome = "ok"
        except GatewayError as error:
            outcome, observation.status = "refused", error.status
            send(error_response(error))
        except UpstreamFailure as exc:
            outcome, observation.status = "upstream_error", 502
            send(error_response(GatewayError(502, f"The engine request failed mid-stream: {exc}")))
        except Exception:
            outcome, observation.status = "internal_error", 500
            log.exception("a stream request failed")
            send(error_response(GatewayError(500, "Internal error.")))
        finally:
            await asyncio.shield(admitted.finish(outcome))
