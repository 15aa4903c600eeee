"""gRPC transport: `ModelStreamInfer` through `tritonclient.grpc.aio`.

One bidirectional stream per request over one shared channel (HTTP/2
multiplexes them). The request side stays open until the final response:
closing it early would half-close the stream before the answer is complete.

Through the gateway (:9001) an `api_key` travels as the call's
`authorization: Bearer <key>` metadata, and cancelling the RPC is the whole
cancel: the gateway stops the engine request by its key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, InferInput, InferResult, KeepAliveOptions
from tritonclient.utils import InferenceServerException

from .config import TimeoutConfig
from .errors import RequestError, ServerConnectionError
from .payload import event_from_outputs, grpc_tensors, stop_values
from .timing import DEFAULT_CLOCK, Clock
from .types import StreamEvent

log = logging.getLogger(__name__)

# tritonclient's aio API cannot ask for empty final responses (the parameter is
# reserved), so a stream ends on the final flag carried by real data, as the
# contract promises. A `stop` may get no answer at all; wait this long for one
# (a "no live request has this request_key" error arrives within milliseconds)
# before hanging up.
STOP_ACK_WAIT_S = 1.0
# Codes that mean "never reached the server / connection lost": retryable.
_CONNECTION_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})
# gRPC core sometimes ends a call whose connection was lost (a killed server)
# with UNKNOWN or INTERNAL instead of UNAVAILABLE (grpc/grpc#34076, "Stream
# removed"); these details are its own transport errors, never Triton's
# (Triton puts a stream's errors inside its responses).
_TRANSPORT_CODES = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
_TRANSPORT_DETAILS = ("Stream removed", "Socket closed", "Connection reset", "Broken pipe", "RST_STREAM", "GOAWAY")

GrpcClientFactory = Callable[[], Any]


def is_final(result: InferResult) -> bool:
    parameter = result.get_response().parameters.get("triton_final_response")
    return bool(parameter is not None and parameter.bool_param)


def outputs_of(result: InferResult) -> dict[str, Any]:
    return {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}


def connection_lost(code: grpc.StatusCode, details: str) -> bool:
    """Whether a call's status says the connection broke, not the server refused."""
    return code in _CONNECTION_CODES or (
        code in _TRANSPORT_CODES and any(marker in details for marker in _TRANSPORT_DETAILS)
    )


def map_rpc_error(exc: BaseException) -> Exception:
    if isinstance(exc, grpc.aio.AioRpcError):
        details = exc.details() or ""
        if connection_lost(exc.code(), details):
            return ServerConnectionError(f"gRPC {exc.code().name}: {details}")
        return RequestError(f"gRPC {exc.code().name}: {details}")
    if isinstance(exc, InferenceServerException):
        # tritonclient wraps a failed call's status as "StatusCode.<NAME>"
        code = getattr(grpc.StatusCode, (exc.status() or "").removeprefix("StatusCode."), None)
        if code is not None and connection_lost(code, exc.message() or ""):
            return ServerConnectionError(f"gRPC {code.name}: {exc.message()}")
        return RequestError(exc.message())
    return ServerConnectionError(repr(exc))


def build_inputs(tensors: list[tuple[str, str, Any]]) -> list[InferInput]:
    inputs = []
    for name, datatype, array in tensors:
        infer_input = InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


async def _one_request(request: dict[str, Any], done: asyncio.Event) -> AsyncIterator[dict[str, Any]]:
    yield request
    await done.wait()


class GrpcResponseStream:
    resumes = 0  # a broken gRPC stream is not resumed

    def __init__(self, responses: Any, done: asyncio.Event, clock: Clock) -> None:
        self._responses = responses
        self._done = done
        self._clock = clock
        self._finished = False

    async def next_event(self) -> StreamEvent | None:
        if self._finished:
            return None
        try:
            result, error = await self._responses.__anext__()
        except StopAsyncIteration:
            self._finish()
            return None
        except (grpc.aio.AioRpcError, InferenceServerException) as exc:
            self._finish()
            raise map_rpc_error(exc) from exc
        received = self._clock()
        if error is not None:
            # An error response ends the request on the server.
            self._finish()
            raise RequestError(error.message() if isinstance(error, InferenceServerException) else str(error))
        final = is_final(result)
        if final:
            self._finish()
        return event_from_outputs(outputs_of(result), received, final=final)

    def _finish(self) -> None:
        self._finished = True
        self._done.set()

    async def aclose(self) -> None:
        if not self._finished:
            self._responses.cancel()
        self._finish()

    async def cancel(self) -> None:
        """Nothing more: the gateway stops the request when the RPC is cancelled
        (`aclose`), and Triton directly is stopped with `send_stop`."""


def channel_args(timeouts: TimeoutConfig) -> list[tuple[str, int]]:
    """The channel's options: tritonclient's defaults (it uses them only when
    given none, so they are repeated here) and the reconnect bounds: attempts
    at most `reconnect_max_s` apart, each given `connect_s` to connect (gRPC's
    "min reconnect backoff" is in fact its connect timeout, 20 s by default)."""
    keepalive = KeepAliveOptions()
    reconnect_ms = round(timeouts.reconnect_max_s * 1000)
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", min(1000, reconnect_ms)),
        ("grpc.max_reconnect_backoff_ms", reconnect_ms),
        ("grpc.min_reconnect_backoff_ms", round(timeouts.connect_s * 1000)),
    ]


class GrpcTransport:
    name = "grpc"

    def __init__(
        self,
        url: str,
        timeouts: TimeoutConfig,
        client_factory: GrpcClientFactory | None = None,
        clock: Clock = DEFAULT_CLOCK,
        *,
        api_key: str | None = None,
    ) -> None:
        self._url = url.removeprefix("grpc://")
        # The gateway reads the key from the call's metadata (gRPC keys are lowercase).
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self._factory = client_factory or self._real_client
        self._client: Any = None
        self._stop_timeout = timeouts.stop_s
        self._channel_args = channel_args(timeouts)
        self._clock = clock

    def _real_client(self) -> Any:
        from tritonclient.grpc import aio as grpc_aio

        return grpc_aio.InferenceServerClient(self._url, channel_args=self._channel_args)

    def _grpc(self) -> Any:
        # Created lazily: a grpc.aio channel binds to the running event loop.
        if self._client is None:
            self._client = self._factory()
        return self._client

    async def open_stream(self, model: str, values: Mapping[str, Any], request_id: str) -> GrpcResponseStream:
        return await self.open_tensor_stream(model, grpc_tensors(values), request_id)

    async def open_tensor_stream(
        self, model: str, tensors: list[tuple[str, str, Any]], request_id: str
    ) -> GrpcResponseStream:
        request = {"model_name": model, "inputs": build_inputs(tensors), "request_id": request_id}
        done = asyncio.Event()
        # Only with a key: a plain Triton call stays exactly what it was.
        extra = {"headers": self._headers} if self._headers else {}
        try:
            responses = self._grpc().stream_infer(_one_request(request, done), **extra)
        except (grpc.RpcError, InferenceServerException) as exc:
            raise map_rpc_error(exc) from exc
        return GrpcResponseStream(responses, done, self._clock)

    async def ready(self, timeout_s: float) -> bool:
        # ServerReady on the shared channel; the key as metadata, as on every call
        # (the gateway's door wants it). client_timeout bounds the RPC itself,
        # wait_for also the channel's connecting, which the deadline may not cover.
        extra = {"headers": self._headers} if self._headers else {}
        try:
            return bool(
                await asyncio.wait_for(self._grpc().is_server_ready(client_timeout=timeout_s, **extra), timeout_s)
            )
        except (TimeoutError, grpc.RpcError, InferenceServerException, OSError) as exc:
            log.debug("readiness of %s: %r", self._url, exc)
            return False

    async def send_stop(self, model: str, request_id: str, request_key: str) -> None:
        # ModelInfer refuses decoupled models, so the stop travels on a stream too.
        tensors = [(name, datatype, array) for name, (datatype, array) in stop_values(request_key).items()]
        stream = await self.open_tensor_stream(model, tensors, request_id)
        try:
            await asyncio.wait_for(self._drain(stream), min(self._stop_timeout, STOP_ACK_WAIT_S))
        except TimeoutError:
            log.debug("no answer to stop (request %s); assuming it was delivered", request_id)
        finally:
            await stream.aclose()

    @staticmethod
    async def _drain(stream: GrpcResponseStream) -> None:
        while await stream.next_event() is not None:
            pass

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
