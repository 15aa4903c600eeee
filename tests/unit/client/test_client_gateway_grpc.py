"""The client through the gateway over gRPC: the API key travels as the call's
`authorization` metadata, and cancelling the RPC is the whole cancel (the
gateway stops the request by its key): no python_llm stop is sent. A fake
`stream_infer` answers with real Triton protobuf responses (grpc_fakes)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from client import AsyncLLMClient, ClientConfig, RetryConfig
from client.grpc_transport import GrpcTransport
from tests.unit.client.grpc_fakes import response

pytestmark = pytest.mark.anyio
API_KEY = "sk-grpc-gateway-0123456789abcdef"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeCall:
    def __init__(self, items: list[Any]) -> None:
        self._items = list(items)
        self.cancelled = False

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> tuple[Any, Any]:
        if self.cancelled or not self._items:
            raise StopAsyncIteration
        item = self._items.pop(0)
        if isinstance(item, float):
            await asyncio.sleep(item)
            item = self._items.pop(0)
        return item, None

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeGatewayGrpc:
    """`tritonclient.grpc.aio.InferenceServerClient` as the gateway's :9001 serves it:
    records each call's metadata (`headers`, as tritonclient takes them)."""

    def __init__(self, scripts: list[list[Any]]) -> None:
        self.scripts = scripts
        self.calls: list[tuple[FakeCall, dict[str, str] | None]] = []

    def stream_infer(self, inputs_iterator: Any, headers: dict[str, str] | None = None) -> FakeCall:
        call = FakeCall(self.scripts.pop(0) if self.scripts else [])
        self.calls.append((call, headers))
        return call

    async def close(self) -> None:
        pass


def grpc_client(fake: FakeGatewayGrpc, api_key: str | None = API_KEY, model: str = "ensemble") -> AsyncLLMClient:
    config = ClientConfig(
        url="127.0.0.1:9001",
        transport="grpc",
        model=model,
        api_key=api_key,
        retry=RetryConfig(backoff_base_s=0.0, backoff_max_s=0.0),
    )
    transport = GrpcTransport(config.url, config.timeouts, client_factory=lambda: fake, api_key=config.api_key)
    return AsyncLLMClient(config, transport=transport)


async def test_the_api_key_is_sent_as_authorization_metadata_and_not_logged(caplog):
    caplog.set_level(logging.DEBUG)
    fake = FakeGatewayGrpc([[response("Par"), response("is", "stop", final=True)]])
    async with grpc_client(fake) as client:
        result = await client.generate("Capital of France?", max_tokens=4)
    assert result.text == "Paris" and result.finish_reason == "stop"
    ((_, headers),) = fake.calls
    assert headers == {"authorization": f"Bearer {API_KEY}"}  # gRPC metadata keys are lowercase
    assert API_KEY not in caplog.text and API_KEY not in repr(client.config)


async def test_cancel_through_the_gateway_only_cancels_the_rpc_even_for_the_ensemble():
    fake = FakeGatewayGrpc([[response("a"), 10.0, response("b", "stop", final=True)]])
    async with grpc_client(fake, model="ensemble") as client:
        async with client.stream("Hi") as stream:
            async for _ in stream:
                break
    assert stream.result.finish_reason == "cancelled"
    ((call, _),) = fake.calls  # no second call: no stop stream to python_llm
    assert call.cancelled


async def test_without_a_key_no_metadata_is_passed_and_the_ensemble_still_gets_its_stop():
    fake = FakeGatewayGrpc([[response("a"), 10.0, response("b", "stop", final=True)], [response("", final=True)]])
    async with grpc_client(fake, api_key=None) as client:
        async with client.stream("Hi") as stream:
            async for _ in stream:
                break
    assert [headers for _, headers in fake.calls] == [None, None]
    assert len(fake.calls) == 2 and fake.calls[0][0].cancelled  # the call, then the stop stream
