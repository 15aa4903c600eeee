"""An exception nothing handled: the caller gets a 500 in the route's error
shape, and the exception stops at the gateway's outermost layer. Were it to reach uvicorn, the server
would close the connection, and a keep-alive client's next request on it
would be reset (the Triton HTTP fuzz of issue 48 saw exactly that)."""

from __future__ import annotations

import asyncio

import httpx

from client import AsyncLLMClient
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.fleet.replica_client import ReplicaClient, client_config
from tests.unit.gateway.openai_fakes import FakePolicy, FakeTransport, simple_script


def _app() -> object:
    config = GatewayConfig()
    client = AsyncLLMClient(client_config("127.0.0.1:1"), transport=FakeTransport(simple_script("x")))
    app = create_app(config, FakePolicy(), ReplicaClient(client=client))

    @app.get("/v1/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.post("/v2/models/{model}/boom")
    async def triton_boom(model: str) -> None:
        raise RuntimeError("a bug")

    return app.state.asgi


def _request(method: str, path: str) -> httpx.Response:
    async def run() -> httpx.Response:
        # raise_app_exceptions: an exception that escapes the app fails the test
        transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.request(method, path)

    return asyncio.run(run())


def test_an_unhandled_exception_is_a_500_in_openais_shape_and_goes_no_further(caplog):
    response = _request("GET", "/v1/boom")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert response.headers["x-request-id"]
    assert sum("unhandled error" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_under_v2_it_is_tritons_shape():
    response = _request("POST", "/v2/models/ensemble/boom")
    assert response.status_code == 500
    assert response.json() == {"error": "Internal error."}


def test_the_connection_serves_the_next_request():
    async def run() -> list[int]:
        transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=True)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return [(await client.get(path)).status_code for path in ("/v1/boom", "/health", "/v1/boom")]

    assert asyncio.run(run()) == [500, 200, 500]
