"""Triton's own protocols through the gateway against the real stack: a real
tritonserver, the gateway as its own process with its gRPC door, the real
tritonclient (grpc and http) and httpx. Greedy answers through the gateway
equal Triton's own for the same request (text, field set), a call without a
key is refused before Triton, and a gRPC cancel frees the KV blocks."""

from __future__ import annotations

import asyncio
import json
import queue
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from client import AsyncLLMClient, ClientConfig
from client.payload import INPUT_DATATYPES
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.test_gateway_openai import Gateway, start_gateway
from tests.e2e.triton_calls import CHAT_PARIS, _grpc_input, grpc_stream, scrape_metrics, sse_stream

pytestmark = pytest.mark.e2e

MAX_TOKENS = 24
GREEDY = {"text_input": "", "messages": CHAT_PARIS, "max_tokens": MAX_TOKENS, "temperature": 0.0}
# outputs whose values differ per request whatever the gateway does
_NUMPY = {"BYTES": np.object_, "INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_}
PER_REQUEST = ("request_key", "request_key_out", "arrival_time_ns", "first_token_time_ns", "last_token_time_ns")


class GrpcGateway:
    def __init__(self, gateway: Gateway, grpc_port: int) -> None:
        self.gateway = gateway
        self.url = f"127.0.0.1:{grpc_port}"
        self.headers = {"authorization": f"Bearer {gateway.key}"}


@pytest.fixture(scope="module")
def door(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GrpcGateway]:
    (grpc_port,) = free_local_ports(1)
    gateway = start_gateway(
        triton_server, tmp_path_factory.mktemp("gateway-triton"), f"gateway.public_grpc_port={grpc_port}"
    )
    yield GrpcGateway(gateway, grpc_port)
    assert gateway.process.stop() == 0


def stream_through(
    door: GrpcGateway,
    model: str,
    inputs: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> tuple[list[Any], str | None]:
    """(responses, error) of one ModelStreamInfer request through the gateway, to its final response."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(door.url)
    got: list[Any] = []
    try:
        client.start_stream(
            callback=lambda result, error: responses.put((result, error)),
            headers=door.headers if headers is None else headers,
        )
        try:
            client.async_stream_infer(model, [_grpc_input(k, v) for k, v in inputs.items()], request_id="mine")
        except InferenceServerException as exc:
            # the server already ended the stream (a refused key); its status came through the callback
            try:
                _, error = responses.get(timeout=10)
            except queue.Empty:
                return got, str(exc)
            return got, str(error if error is not None else exc)
        while True:
            result, error = responses.get(timeout=timeout)
            if error is not None:
                return got, str(error)
            got.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got, None
    finally:
        try:
            client.stop_stream()
        except InferenceServerException:
            pass  # the stream already ended with the error the caller returned (a refused key)
        client.close()


def texts(results: list[Any]) -> str:
    return "".join(v.decode() for r in results for v in r.as_numpy("text_output").reshape(-1))


def triton_requests(triton: TritonServer) -> float:
    metrics = scrape_metrics(triton.metrics_url)
    return metrics.get("nv_inference_request_success", 0.0) + metrics.get("nv_inference_request_failure", 0.0)


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_grpc_stream_through_the_gateway_equals_triton_direct(door, triton_server, model):
    inputs = {**GREEDY, "stream": True}
    direct = grpc_stream(triton_server.grpc_url, model, inputs)
    assert direct.error is None, direct.error
    started = time.perf_counter()
    results, error = stream_through(door, model, inputs)
    took = time.perf_counter() - started
    assert error is None, error
    assert texts(results) == direct.text and "Paris" in direct.text
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in results]
    assert finals[-1] is True and not any(finals[:-1]) and len(results) > 1
    assert all(r.get_response().id == "mine" for r in results)
    last = results[-1]
    assert last.as_numpy("finish_reason").reshape(-1)[0].decode() == direct.finish_reason
    print(f"\n[{model}] gRPC through the gateway: {len(results)} responses in {took:.2f} s: {texts(results)!r}")


def test_model_infer_through_the_gateway_answers_whole(door, triton_server):
    direct = grpc_stream(triton_server.grpc_url, "ensemble", {**GREEDY, "stream": True})
    client = grpcclient.InferenceServerClient(door.url)
    try:
        result = client.infer("ensemble", [_grpc_input(k, v) for k, v in GREEDY.items()], headers=door.headers)
    finally:
        client.close()
    assert result.as_numpy("text_output").reshape(-1)[0].decode() == direct.text
    assert result.as_numpy("num_output_tokens").reshape(-1)[0] > 0


def test_grpc_without_a_key_never_reaches_triton(door, triton_server):
    before = triton_requests(triton_server)
    results, error = stream_through(door, "ensemble", GREEDY, headers={})
    assert results == [] and error is not None and "API key" in error, error
    client = grpcclient.InferenceServerClient(door.url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer(
                "ensemble", [_grpc_input(k, v) for k, v in GREEDY.items()], headers={"authorization": "Bearer sk-wrong"}
            )
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
    finally:
        client.close()
    assert triton_requests(triton_server) == before


def kv_blocks_used(triton: TritonServer) -> float:
    return scrape_metrics(triton.metrics_url)["llm_kv_cache_blocks_used"]


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_a_grpc_cancel_frees_the_kv_blocks(door, triton_server, model):
    idle = kv_blocks_used(triton_server)
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(door.url)
    inputs = {
        "text_input": "Write a very long story about the sea.",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=door.headers)
        client.async_stream_infer(model, [_grpc_input(k, v) for k, v in inputs.items()])
        for _ in range(5):
            result, error = responses.get(timeout=120)
            assert error is None, error
        busy = kv_blocks_used(triton_server)
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    assert busy > idle, "the running request held no KV blocks: nothing to measure"
    started = time.monotonic()
    while kv_blocks_used(triton_server) > idle:
        assert time.monotonic() - started < 30, f"{model}: KV blocks not freed within 30 s of the gRPC cancel"
        time.sleep(0.02)
    print(f"\n[{model}] KV blocks back to idle {time.monotonic() - started:.2f} s after the gRPC cancel")


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in body.items() if name not in PER_REQUEST}


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_generate_through_the_gateway_equals_triton_direct(door, triton_server, model):
    body = {**GREEDY, "id": "abc", "return_output_ids": True}
    direct = httpx.post(f"{triton_server.http_url}/v2/models/{model}/generate", json=body, timeout=120)
    assert direct.status_code == 200, direct.text
    through = httpx.post(
        f"{door.gateway.root}/v2/models/{model}/generate",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {door.gateway.key}"},
    )
    assert through.status_code == 200, through.text
    assert set(through.json()) == set(direct.json()), (sorted(through.json()), sorted(direct.json()))
    assert comparable(through.json()) == comparable(direct.json())
    assert "Paris" in through.json()["text_output"] and through.json()["id"] == "abc"
    refused = httpx.post(
        f"{door.gateway.root}/v2/models/{model}/generate",
        json={**body, "stream": True},
        headers={"Authorization": f"Bearer {door.gateway.key}"},
        timeout=30,
    )
    assert refused.status_code == 400 and refused.json()["error"].startswith("stream: ")


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_generate_stream_through_the_gateway_equals_triton_direct(door, triton_server, model):
    body = {**GREEDY, "stream": True, "return_output_ids": True}
    direct = sse_stream(triton_server.http_url, model, body)
    assert direct.error is None, direct.error
    headers = {"Authorization": f"Bearer {door.gateway.key}"}
    events = []
    with httpx.Client(timeout=120) as http:
        with http.stream(
            "POST", f"{door.gateway.root}/v2/models/{model}/generate_stream", json=body, headers=headers
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: ") :]))
    assert "".join(e["text_output"] for e in events) == direct.text
    assert [comparable(e) for e in events] == [comparable(e) for e in direct.events]


def test_tritonclient_http_infer_through_the_gateway(door, triton_server):
    direct = httpx.post(f"{triton_server.http_url}/v2/models/ensemble/generate", json=GREEDY, timeout=120).json()
    host = door.gateway.root.removeprefix("http://")
    client = httpclient.InferenceServerClient(host, network_timeout=120)
    # unchanged tritonclient.http (it sends no Content-Type); the key as for every route
    headers = {"Authorization": f"Bearer {door.gateway.key}"}
    try:
        for binary in (True, False):
            inputs = []
            for name, value in GREEDY.items():
                datatype = INPUT_DATATYPES[name]
                array = np.array([[value.encode() if isinstance(value, str) else value]], dtype=_NUMPY[datatype])
                tensor = httpclient.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array, binary_data=binary)
                inputs.append(tensor)
            # a fresh dict: tritonclient writes Inference-Header-Content-Length into the one it is given
            result = client.infer("ensemble", inputs, headers=dict(headers), request_id="h1")
            assert result.as_numpy("text_output").reshape(-1)[0].decode() == direct["text_output"]
            assert result.get_response()["id"] == "h1"
        assert client.is_server_live() and client.is_model_ready("llm_bls", headers=headers)
        assert client.get_model_metadata("ensemble", headers=headers)["name"] == "ensemble"
    finally:
        client.close()


def test_the_client_library_over_grpc_through_the_gateway(door, triton_server):
    """The project's own client (transport grpc, `api_key`: the door's metadata) gets Triton's greedy text."""
    direct = grpc_stream(triton_server.grpc_url, "llm_bls", {**GREEDY, "stream": True})

    async def through() -> Any:
        config = ClientConfig(url=door.url, transport="grpc", model="llm_bls", api_key=door.gateway.key)
        async with AsyncLLMClient(config) as client:
            return await client.generate("", max_tokens=MAX_TOKENS, temperature=0.0, messages=json.loads(CHAT_PARIS))

    result = asyncio.run(through())
    assert result.error is None and result.text == direct.text and result.num_responses > 1
