"""`AsyncLLMClient.ready()`: Triton's readiness (gRPC ServerReady, SSE GET
/v2/health/ready) as a bool, False for "not ready", "unreachable" and "too
slow" alike, bounded by `TimeoutConfig.connect_s`. Fakes behind the transports'
seams, plus a real closed port for each transport, and a real gRPC server
(a fake servicer) gone and back: the channel's reconnect bound."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client import AsyncLLMClient, ClientConfig, TimeoutConfig
from client.grpc_transport import GrpcTransport, channel_args
from client.sse_transport import SseTransport
from serving.launcher import free_local_ports

pytestmark = pytest.mark.anyio

FAST = TimeoutConfig(connect_s=0.2)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- SSE -----------------------------------------------------------------------


def sse_client(handler: Any, *, api_key: str | None = None, timeouts: TimeoutConfig = FAST) -> AsyncLLMClient:
    config = ClientConfig(url="http://triton.test", timeouts=timeouts, api_key=api_key)
    transport = SseTransport(config.url, config.timeouts, http_transport=httpx.MockTransport(handler), api_key=api_key)
    return AsyncLLMClient(config, transport=transport)


async def test_sse_ready_is_a_get_of_health_ready_with_the_key():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    async with sse_client(handler, api_key="sk-test-key") as client:
        assert await client.ready() is True
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/v2/health/ready")]
    assert seen[0].headers["authorization"] == "Bearer sk-test-key"


@pytest.mark.parametrize("status", [400, 404, 503])
async def test_sse_any_other_status_is_not_ready(status: int):
    async with sse_client(lambda request: httpx.Response(status)) as client:
        assert await client.ready() is False


async def test_sse_connection_error_is_not_ready():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with sse_client(handler) as client:
        assert await client.ready() is False


async def test_sse_a_server_that_never_answers_is_not_ready_within_connect_s():
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200)

    async with sse_client(handler) as client:
        t0 = time.monotonic()
        assert await client.ready() is False
        elapsed = time.monotonic() - t0
    assert elapsed < FAST.connect_s + 1.0, elapsed


async def test_sse_closed_port_is_not_ready():
    (port,) = free_local_ports(1)
    async with AsyncLLMClient(ClientConfig(url=f"http://127.0.0.1:{port}", timeouts=FAST)) as client:
        assert await client.ready() is False


# -- gRPC ----------------------------------------------------------------------


class FakeReadyClient:
    """`tritonclient.grpc.aio.InferenceServerClient.is_server_ready`, scripted."""

    def __init__(self, answer: Any = True, delay_s: float = 0.0) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []

    async def is_server_ready(self, headers: Any = None, client_timeout: Any = None) -> bool:
        self.calls.append({"headers": headers, "client_timeout": client_timeout})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        pass


def grpc_client(fake: FakeReadyClient, *, api_key: str | None = None) -> AsyncLLMClient:
    config = ClientConfig(url="127.0.0.1:8001", transport="grpc", timeouts=FAST, api_key=api_key)
    return AsyncLLMClient(
        config, transport=GrpcTransport(config.url, config.timeouts, client_factory=lambda: fake, api_key=api_key)
    )


@pytest.mark.parametrize("answer", [True, False])
async def test_grpc_ready_is_server_ready_bounded_by_connect_s(answer: bool):
    fake = FakeReadyClient(answer)
    async with grpc_client(fake) as client:
        assert await client.ready() is answer
    assert fake.calls == [{"headers": None, "client_timeout": FAST.connect_s}]


async def test_grpc_ready_carries_the_key_as_metadata():
    fake = FakeReadyClient(True)
    async with grpc_client(fake, api_key="sk-test-key") as client:
        assert await client.ready() is True
    assert fake.calls[0]["headers"] == {"authorization": "Bearer sk-test-key"}


async def test_grpc_error_is_not_ready():
    fake = FakeReadyClient(InferenceServerException("failed to connect to all addresses"))
    async with grpc_client(fake) as client:
        assert await client.ready() is False


async def test_grpc_a_server_that_never_answers_is_not_ready_within_connect_s():
    fake = FakeReadyClient(True, delay_s=30.0)
    async with grpc_client(fake) as client:
        t0 = time.monotonic()
        assert await client.ready() is False
        elapsed = time.monotonic() - t0
    assert elapsed < FAST.connect_s + 1.0, elapsed


async def test_grpc_closed_port_is_not_ready():
    (port,) = free_local_ports(1)
    config = ClientConfig(url=f"127.0.0.1:{port}", transport="grpc", timeouts=FAST)
    async with AsyncLLMClient(config) as client:
        t0 = time.monotonic()
        assert await client.ready() is False
        elapsed = time.monotonic() - t0
    assert elapsed < FAST.connect_s + 1.0, elapsed


# -- gRPC: reconnecting after the server was gone ---------------------------------


class ReadyServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802 (the gRPC method's name)
        return service_pb2.ServerReadyResponse(ready=True)


def test_channel_args_keep_tritonclients_defaults_and_bound_reconnecting():
    args = dict(channel_args(TimeoutConfig(connect_s=3.0, reconnect_max_s=0.5)))
    assert args["grpc.max_receive_message_length"] == MAX_GRPC_MESSAGE_SIZE
    assert args["grpc.keepalive_timeout_ms"] == KeepAliveOptions().keepalive_timeout_ms
    assert args["grpc.max_reconnect_backoff_ms"] == 500
    assert args["grpc.initial_reconnect_backoff_ms"] == 500
    assert args["grpc.min_reconnect_backoff_ms"] == 3000
    with pytest.raises(ValueError, match="reconnect_max_s"):
        TimeoutConfig(reconnect_max_s=0)


def ready_server(port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(ReadyServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    return server


async def test_grpc_ready_again_soon_after_a_gone_server_comes_back():
    # a server that was up, then gone for 3 s: gRPC's own backoff would try
    # again 1, 1.6 and 2.6 s apart (the next at ~5.2 s); bounded at 0.2 s,
    # the channel sees it back well before that
    (port,) = free_local_ports(1)
    timeouts = TimeoutConfig(connect_s=0.5, reconnect_max_s=0.2)
    config = ClientConfig(url=f"127.0.0.1:{port}", transport="grpc", timeouts=timeouts)
    first = ready_server(port)
    await first.start()
    async with AsyncLLMClient(config) as client:
        assert await client.ready() is True
        await first.stop(None)
        down_until = time.monotonic() + 3.0
        while time.monotonic() < down_until:  # the channel fails and backs off
            assert await client.ready() is False
            await asyncio.sleep(0.05)
        second = ready_server(port)
        await second.start()
        try:
            up = time.monotonic()
            while not await client.ready():
                assert time.monotonic() - up < 5.0, "not ready 5 s after the server came back"
                await asyncio.sleep(0.02)
            back_s = time.monotonic() - up
        finally:
            await second.stop(None)
    print(f"\n[ready {back_s:.2f} s after the server came back (reconnect_max_s 0.2)]")
    assert back_s < 1.0, back_s
