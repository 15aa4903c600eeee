"""gRPC transport behind its seam: a fake `stream_infer` answering with real
Triton protobuf responses, so tensor shapes, flags and errors are the real ones."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from client import AsyncLLMClient, ClientConfig, RequestError, RetryConfig, ServerConnectionError
from client.grpc_transport import GrpcTransport, map_rpc_error
from tests.unit.client.grpc_fakes import key_of, response

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeCall:
    def __init__(self, items: list[Any], requests: Any, log: list[dict]) -> None:
        self._items = list(items)
        self._requests = requests
        self._log = log
        self.cancelled = False

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> tuple[Any, Any]:
        if not self._log or self._log[-1].get("_call") is not self:
            self._log.append({**(await self._requests.__anext__()), "_call": self})
        if self.cancelled or not self._items:
            raise StopAsyncIteration
        item = self._items.pop(0)
        if isinstance(item, float):
            await asyncio.sleep(item)
            item = self._items.pop(0)
        if isinstance(item, grpc.aio.AioRpcError):
            raise item
        return (None, item) if isinstance(item, InferenceServerException) else (item, None)

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeGrpcClient:
    """What `tritonclient.grpc.aio.InferenceServerClient.stream_infer` gives back, scripted."""

    def __init__(self, scripts: list[list[Any]]) -> None:
        self.scripts = scripts
        self.requests: list[dict] = []
        self.calls: list[FakeCall] = []
        self.closed = False

    def stream_infer(self, inputs_iterator: Any) -> FakeCall:
        call = FakeCall(self.scripts.pop(0) if self.scripts else [], inputs_iterator, self.requests)
        self.calls.append(call)
        return call

    async def close(self) -> None:
        self.closed = True


def grpc_client(fake: FakeGrpcClient, model: str = "ensemble", **config: Any) -> AsyncLLMClient:
    config.setdefault("retry", RetryConfig(backoff_base_s=0.0, backoff_max_s=0.0))
    cfg = ClientConfig(url="127.0.0.1:8001", transport="grpc", model=model, **config)
    return AsyncLLMClient(cfg, transport=GrpcTransport(cfg.url, cfg.timeouts, client_factory=lambda: fake))


def inputs_by_name(request: dict) -> dict[str, Any]:
    return {i.name(): i for i in request["inputs"]}


async def test_stream_inputs_are_batched_tensors_and_final_flag_ends_the_stream():
    fake = FakeGrpcClient(
        [[response("Hel", ids=[1, 2]), response("lo", "stop", final=True, ids=[3]), response("never read")]]
    )
    async with grpc_client(fake) as client:
        result = await client.generate(
            "Hi",
            max_tokens=4,
            temperature=0.0,
            stop_words=["a", "b"],
            messages=[{"role": "user", "content": "Hi"}],
            request_id="g-1",
        )
    assert result.text == "Hello" and result.finish_reason == "stop"
    assert result.output_ids == [1, 2, 3] and result.num_output_tokens == 2
    request = fake.requests[0]
    assert request["model_name"] == "ensemble" and request["request_id"] == "g-1"
    assert "parameters" not in request  # tritonclient rejects the reserved empty-final parameter
    inputs = inputs_by_name(request)
    assert inputs["text_input"].shape() == [1, 1] and inputs["text_input"].datatype() == "BYTES"
    assert inputs["max_tokens"].shape() == [1, 1] and inputs["max_tokens"].datatype() == "INT32"
    assert inputs["temperature"].datatype() == "FP32" and inputs["stream"].datatype() == "BOOL"
    assert inputs["stop_words"].shape() == [1, 2]
    assert inputs["messages"].datatype() == "BYTES"
    assert not fake.calls[0].cancelled  # ended by the final flag, nothing to cancel


async def test_error_message_before_data_is_a_request_error_and_overload_is_retried():
    fake = FakeGrpcClient(
        [
            [InferenceServerException("in ensemble 'ensemble', overloaded: queue full")],
            [InferenceServerException("max_tokens: must be > 0")],
        ]
    )
    async with grpc_client(fake) as client:
        with pytest.raises(RequestError, match="max_tokens: must be > 0"):
            await client.generate("Hi")
    assert len(fake.requests) == 2  # the overload was retried, the bad input was not


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


async def test_a_connection_lost_reported_as_unknown_stream_removed_is_retried_like_unavailable():
    # what gRPC core can report when the server is killed mid-call (grpc/grpc#34076)
    fake = FakeGrpcClient(
        [[rpc_error(grpc.StatusCode.UNKNOWN, "Stream removed")], [response("ok", "stop", final=True)]]
    )
    async with grpc_client(fake) as client:
        result = await client.generate("Hi")
    assert result.text == "ok" and len(fake.requests) == 2


async def test_a_connection_lost_without_retries_is_a_connection_error_not_a_refusal():
    fake = FakeGrpcClient([[rpc_error(grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2")]])
    async with grpc_client(fake, retry=RetryConfig(max_attempts=1)) as client:
        with pytest.raises(ServerConnectionError, match="RST_STREAM"):
            await client.generate("Hi")


@pytest.mark.parametrize(
    "error, connection",
    [
        (rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"), True),
        (rpc_error(grpc.StatusCode.UNKNOWN, "Stream removed"), True),
        (rpc_error(grpc.StatusCode.UNKNOWN, "Exception calling application"), False),
        (rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "Socket closed"), False),
        (InferenceServerException("socket", status="StatusCode.UNAVAILABLE"), True),
        (InferenceServerException("max_tokens: must be > 0"), False),
    ],
)
def test_which_call_failures_mean_the_connection_was_lost(error, connection):
    assert isinstance(map_rpc_error(error), ServerConnectionError if connection else RequestError)


async def test_error_after_data_ends_with_finish_reason_error():
    fake = FakeGrpcClient([[response("part"), InferenceServerException("engine died")]])
    async with grpc_client(fake) as client:
        result = await client.generate("Hi")
    assert result.text == "part" and result.finish_reason == "error" and result.error == "engine died"


async def test_cancel_cancels_the_call_and_sends_stop_on_a_stream_for_ensemble():
    fake = FakeGrpcClient([[response("a"), 10.0, response("b", "stop", final=True)], [response("", final=True)]])
    async with grpc_client(fake) as client:
        async with client.stream("Hi", request_id="grpc-cancel") as stream:
            async for _ in stream:
                break
    assert fake.calls[0].cancelled
    stop_request = fake.requests[1]
    assert stop_request["model_name"] == "python_llm" and stop_request["request_id"] == "grpc-cancel"
    stop_inputs = inputs_by_name(stop_request)
    assert stop_inputs["stop"].datatype() == "BOOL" and stop_inputs["stop"].shape() == [1, 1]
    assert stop_inputs["input_ids"].datatype() == "INT32"
    assert set(stop_inputs) == {"input_ids", "input_lengths", "request_output_len", "stop", "request_key"}
    assert stop_inputs["request_key"].datatype() == "BYTES" and stop_inputs["request_key"].shape() == [1, 1]
    assert fake.closed


async def test_llm_bls_cancel_only_cancels_the_call():
    fake = FakeGrpcClient([[response("a"), 10.0, response("b", "stop", final=True)]])
    async with grpc_client(fake, model="llm_bls") as client:
        async with client.stream("Hi") as stream:
            async for _ in stream:
                break
    assert fake.calls[0].cancelled and len(fake.requests) == 1


async def test_the_request_key_is_a_tensor_reused_on_retry_and_carried_by_the_stop():
    fake = FakeGrpcClient(
        [
            [InferenceServerException("in ensemble 'ensemble', overloaded: queue full")],
            [response("a"), 10.0, response("b", "stop", final=True)],
            [response("", final=True)],
        ]
    )
    async with grpc_client(fake) as client:
        async with client.stream("Hi", request_id="grpc-key") as stream:
            async for _ in stream:
                break
    assert stream.result.attempts == 2
    attempts, stop_request = fake.requests[:2], fake.requests[2]
    for request in attempts:
        key_input = inputs_by_name(request)["request_key"]
        assert key_input.datatype() == "BYTES" and key_input.shape() == [1, 1]
        assert key_of(key_input) == stream.request_key
    assert stop_request["model_name"] == "python_llm" and stop_request["request_id"] == "grpc-key"
    assert key_of(inputs_by_name(stop_request)["request_key"]) == stream.request_key


async def test_grpc_requests_get_distinct_keys_and_a_caller_key_is_kept():
    caller_key = "grpc_caller-key_0123456789abcdefgh"
    fake = FakeGrpcClient([[response("a", "stop", final=True)] for _ in range(3)])
    async with grpc_client(fake) as client:
        minted = [await client.generate("Hi") for _ in range(2)]
        given = await client.generate("Hi", request_key=caller_key)
    sent = [key_of(inputs_by_name(request)["request_key"]) for request in fake.requests]
    assert (
        sent == [minted[0].request_key, minted[1].request_key, caller_key] == [r.request_key for r in (*minted, given)]
    )
    assert minted[0].request_key != minted[1].request_key


async def test_the_echoed_request_key_output_is_read():
    key = "echoed_key-0123456789abcdefghijkl"
    fake = FakeGrpcClient([[response("a", request_key=key), response("b", "stop", final=True, request_key=key)]])
    async with grpc_client(fake) as client:
        stream = client.stream("Hi", request_key=key)
        events = [event async for event in stream]
    assert [event.request_key for event in events] == [key, key] and stream.result.request_key == key
