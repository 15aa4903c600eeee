"""The gateway's gRPC door: KServe v2 `GRPCInferenceService` on
`gateway.host:gateway.public_grpc_port` (0: off), for the public models only,
in the gateway's own event loop (started and stopped by app.py's lifespan;
the same policy and upstream as the HTTP routes).

Served: ServerLive, ServerReady (open, for probes), ServerMetadata,
ModelReady, ModelMetadata, ModelConfig, ModelInfer (one whole answer: `stream`
must be false) and ModelStreamInfer (grpc_stream.py). Everything else
(repository, shared memory, statistics, trace, logging) answers UNIMPLEMENTED,
the servicer base class's default.

Authentication is the `authorization: Bearer <key>` metadata. A refusal is
the gRPC status a client library acts on: 400 INVALID_ARGUMENT, 401
UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED
(Retry-After in the trailing metadata), 503 UNAVAILABLE, 504
DEADLINE_EXCEEDED, else INTERNAL. Every request is decoded from protobuf,
validated by inputs.py and re-sent upstream through the client library,
never forwarded as bytes; a caller's cancel closes the upstream stream, which
sends `stop` with the request key (the KV blocks are freed at once)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, NoReturn

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from ..config import GatewayConfig
from ..core.errors import GatewayError
from ..core.policy import Caller, Policy
from ..core.upstream import Upstream, UpstreamFailure
from ..lifecycle.drain import DrainState
from . import calls, metadata
from .grpc_observe import Observation, metadata_of, observed
from .grpc_stream import serve_stream
from .outputs import infer_proto, visible
from .wire_proto import validated_request

log = logging.getLogger(__name__)

STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_INFER_REFUSES_STREAM = "must be false on ModelInfer, which answers once (stream with ModelStreamInfer)"
# in-flight requests get this long to finish when the gateway stops; then they are cancelled
# (their cleanup stops the engine requests)
STOP_GRACE_S = 5.0


def status_code(error: GatewayError) -> grpc.StatusCode:
    return STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)


class TritonDoor(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, policy: Policy, upstream: Upstream, drain: DrainState | None = None) -> None:
        self.policy = policy
        self.upstream = upstream
        self.drain = drain or DrainState()

    async def abort(
        self, context: grpc.aio.ServicerContext, error: GatewayError, observation: Observation | None = None
    ) -> NoReturn:
        if observation is not None:
            observation.status = error.status
        trailing = tuple((key.lower(), value) for key, value in error.headers.items())
        await context.abort(status_code(error), error.message, trailing_metadata=trailing)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    async def authenticate(self, context: grpc.aio.ServicerContext, observation: Observation | None = None) -> Caller:
        if self.drain.draining:
            # as the HTTP side: a shutting-down gateway admits nothing new (UNAVAILABLE: retry elsewhere)
            await self.abort(
                context,
                GatewayError(
                    503,
                    "The gateway is shutting down; retry on another one.",
                    code="draining",
                    headers={"Retry-After": "1"},
                ),
                observation,
            )
        try:
            caller = await self.policy.authenticate(metadata_of(context).get("authorization"))
        except GatewayError as error:
            await self.abort(context, error, observation)
        if observation is not None:
            observation.context.tier, observation.context.key_id = caller.tier_name, caller.key_id
        return caller

    # health: open, for probes

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=not self.drain.draining)

    # metadata: authenticated

    async def _model(self, context: grpc.aio.ServicerContext, model: str, version: str) -> None:
        with observed("triton_metadata", "ModelMetadata", metadata_of(context)) as observation:
            caller = await self.authenticate(context, observation)
            try:
                calls.check_model(self.policy, caller, model, version)
            except GatewayError as error:
                await self.abort(context, error, observation)

    async def ServerMetadata(
        self, request: service_pb2.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerMetadataResponse:
        await self.authenticate(context)
        return metadata.server_proto()

    async def ModelReady(
        self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelReadyResponse:
        await self._model(context, request.name, request.version)
        return service_pb2.ModelReadyResponse(ready=True)

    async def ModelMetadata(
        self, request: service_pb2.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelMetadataResponse:
        await self._model(context, request.name, request.version)
        return metadata.model_proto(request.name)

    async def ModelConfig(
        self, request: service_pb2.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelConfigResponse:
        await self._model(context, request.name, request.version)
        return service_pb2.ModelConfigResponse(config=metadata.model_config(request.name))

    # inference

    async def ModelInfer(
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        with observed("grpc_infer", "ModelInfer", metadata_of(context)) as observation:
            caller = await self.authenticate(context, observation)
            try:
                call, requested = validated_request(caller, request, _INFER_REFUSES_STREAM)
                calls.check_model(self.policy, caller, call.model, request.model_version)
                admitted = await calls.admit(self.policy, self.upstream, caller, call, route="grpc_infer")
            except GatewayError as error:
                await self.abort(context, error, observation)
            outcome = "cancelled"
            try:
                await admitted.start()
                event = await admitted.whole()
                outcome = "ok"
                return infer_proto(call.model, visible(call, event.outputs, requested), call.caller_id)
            except GatewayError as error:
                outcome = "refused"
                await self.abort(context, error, observation)
            except UpstreamFailure as exc:
                outcome = "upstream_error"
                await self.abort(context, GatewayError(502, f"The engine request failed: {exc}"), observation)
            finally:
                # shielded: a cancelled call still stops its engine request and frees its admission
                await asyncio.shield(admitted.finish(outcome))

    async def ModelStreamInfer(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await serve_stream(self, request_iterator, context)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class GrpcDoor:
    """The server's lifecycle, for app.py's lifespan."""

    def __init__(
        self, config: GatewayConfig, policy: Policy, upstream: Upstream, drain: DrainState | None = None
    ) -> None:
        self.address = _address(config.host, config.public_grpc_port)
        self.max_message_bytes = config.limits.max_body_bytes
        self.servicer = TritonDoor(policy, upstream, drain)
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        # created here, in the running event loop: a grpc.aio server binds to the loop it is made in
        # bounded like an HTTP body; and no SO_REUSEPORT (gRPC's default on
        # Linux): a second gateway on the same port must fail to start, not
        # silently share the callers of the first
        self.server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", self.max_message_bytes), ("grpc.so_reuseport", 0)]
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, self.server)
        try:
            self.port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:  # grpcio raises when it cannot bind
            raise RuntimeError(f"the gRPC door cannot listen on {self.address}: {exc}") from None
        if not self.port:
            raise RuntimeError(f"the gRPC door cannot listen on {self.address}")
        await self.server.start()
        log.info("gRPC door (KServe v2) listening on %s", self.address)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.server is not None:
            await self.server.stop(grace_s)


async def start_door(
    config: GatewayConfig, policy: Policy, upstream: Upstream, drain: DrainState | None = None
) -> GrpcDoor | None:
    """The running door, or None when `public_grpc_port` is 0."""
    if not config.public_grpc_port:
        return None
    door = GrpcDoor(config, policy, upstream, drain)
    await door.start()
    return door
