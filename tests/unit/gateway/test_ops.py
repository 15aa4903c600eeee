"""The operational endpoints off the public port (gateway/ops/server.py): the public
app answers 404 on /metrics and /admin/* and lists neither in its OpenAPI
document; the ops app serves them (admin still behind the admin key); both
servers run in one event loop, the ops one through the public one's drain and
stopping after it; a taken ops port fails the start naming the setting."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from client import AsyncLLMClient
from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.fleet.replica_client import ReplicaClient, client_config
from gateway.lifecycle.drain import DrainingServer
from gateway.ops.server import OpsBindError, ops_server, serve_together
from serving.gateway_process import GatewayProcess
from tests.unit.gateway.openai_fakes import AUTH, FakePolicy, FakeTransport, simple_script

ADMIN_KEY = "ops-admin-key-0123456789"
CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
OPS_PATHS = [
    ("GET", "/metrics"),
    ("GET", "/admin/replicas"),
    ("GET", "/admin/degradation"),
    ("POST", "/admin/replicas/default/drain"),
    ("POST", "/admin/replicas/default/resume"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def build(tmp_path: Path, **config: Any) -> Any:
    key_file = tmp_path / "admin_key"
    key_file.write_text(ADMIN_KEY)
    client = AsyncLLMClient(client_config("127.0.0.1:1"), transport=FakeTransport(simple_script("Pa", "ris")))
    settings = GatewayConfig(admin_key_file=str(key_file), public_grpc_port=0, **config)
    return create_app(settings, FakePolicy(), ReplicaClient(client=client))


async def request(
    asgi: Any, method: str, path: str, headers: dict[str, str] | None = None, json: Any = None
) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://gw") as client:
        return await client.request(method, path, headers=headers, json=json)


def test_the_public_app_answers_404_on_ops_paths_even_with_the_admin_key(tmp_path: Path):
    app = build(tmp_path)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

    async def scenario() -> list[httpx.Response]:
        return [await request(app.state.asgi, method, path, headers=admin) for method, path in OPS_PATHS]

    for (method, path), response in zip(OPS_PATHS, asyncio.run(scenario())):
        assert response.status_code == 404, (method, path, response.status_code)
        assert response.json()["error"]["type"] == "not_found_error"
    paths = app.openapi()["paths"]
    assert "/v1/chat/completions" in paths
    assert not [p for p in paths if p.startswith("/admin") or p == "/metrics"], sorted(paths)


def test_the_ops_app_serves_metrics_and_admin_behind_the_admin_key(tmp_path: Path):
    app = build(tmp_path)

    async def scenario() -> dict[str, httpx.Response]:
        return {
            "chat": await request(app.state.asgi, "POST", "/v1/chat/completions", headers=AUTH, json=CHAT),
            "metrics": await request(app.state.ops_asgi, "GET", "/metrics"),
            "no_key": await request(app.state.ops_asgi, "GET", "/admin/replicas"),
            "api_key": await request(app.state.ops_asgi, "GET", "/admin/replicas", headers=AUTH),
            "admin": await request(
                app.state.ops_asgi, "GET", "/admin/replicas", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
            ),
            "api_route": await request(app.state.ops_asgi, "POST", "/v1/chat/completions", headers=AUTH, json=CHAT),
            "openapi": await request(app.state.ops_asgi, "GET", "/openapi.json"),
        }

    r = asyncio.run(scenario())
    assert r["chat"].status_code == 200
    assert r["metrics"].status_code == 200 and r["metrics"].headers["content-type"].startswith("text/plain")
    assert 'gateway_key_requests_total{key_id="k1",tier="free"}' in r["metrics"].text
    assert r["no_key"].status_code == 401 and r["api_key"].status_code == 401
    assert r["no_key"].json()["error"]["code"] == "invalid_admin_key"
    assert r["admin"].status_code == 200 and [x["name"] for x in r["admin"].json()["replicas"]] == ["default"]
    # the ops listener is not a second door to the API, and publishes no schema
    assert r["api_route"].status_code == 404 and r["openapi"].status_code == 404


def test_both_listeners_in_one_loop_ops_through_the_drain_and_down_last(tmp_path: Path):
    port, ops_port = free_port(), free_port()
    app = build(tmp_path, host="127.0.0.1", port=port, ops_port=ops_port, drain_timeout_s=30)
    busy = [1]
    public = DrainingServer(
        uvicorn.Config(app.state.asgi, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on"),
        app.state.drain,
        busy=lambda: busy[0],
        drain_timeout_s=30,
    )
    ops = ops_server(app.state.config, app)
    assert ops is not None and ops.socket.getsockname()[:2] == ("127.0.0.1", ops_port)  # loopback by default

    async def scenario() -> dict[str, Any]:
        served = asyncio.create_task(serve_together(public, ops))
        while not (public.started and ops.started):
            await asyncio.sleep(0.02)
        seen: dict[str, Any] = {}
        async with httpx.AsyncClient(timeout=5) as http:
            seen["public_metrics"] = (await http.get(f"http://127.0.0.1:{port}/metrics")).status_code
            seen["ops_metrics"] = (await http.get(f"http://127.0.0.1:{ops_port}/metrics")).status_code
            public.handle_exit(signal.SIGTERM, None)  # the drain begins; one request still "running"
            await asyncio.sleep(0.3)
            seen["health_draining"] = (await http.get(f"http://127.0.0.1:{port}/health")).status_code
            seen["ops_while_draining"] = (await http.get(f"http://127.0.0.1:{ops_port}/metrics")).text
            busy[0] = 0  # the last request ends: both servers stop
            await asyncio.wait_for(served, 20)
            try:
                await http.get(f"http://127.0.0.1:{ops_port}/metrics")
                seen["ops_after"] = "answered"
            except httpx.ConnectError:
                seen["ops_after"] = "closed"
        return seen

    seen = asyncio.run(scenario())
    assert seen["public_metrics"] == 404 and seen["ops_metrics"] == 200
    assert seen["health_draining"] == 503
    assert "gateway_draining 1.0" in seen["ops_while_draining"]
    assert seen["ops_after"] == "closed" and public.started


def test_a_taken_ops_port_names_the_setting_and_zero_turns_it_off(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        app = build(tmp_path, ops_port=taken.getsockname()[1])
        with pytest.raises(OpsBindError, match="gateway.ops_port"):
            ops_server(app.state.config, app)
    assert ops_server(GatewayConfig(ops_port=0), app) is None


def test_gateway_process_knows_its_ops_url(tmp_path: Path):
    chosen = GatewayProcess(["gateway.port=9100"], tmp_path / "log", port=9100)
    port = int(chosen.assignments[-1].removeprefix("gateway.ops_port="))  # a free one, so tests never collide
    assert chosen.ops_url == f"http://127.0.0.1:{port}" and chosen.metrics_url == f"{chosen.ops_url}/metrics"
    assigned = GatewayProcess(["gateway.ops_port=9102"], tmp_path / "log", port=9100)
    assert assigned.ops_url == "http://127.0.0.1:9102" and assigned.assignments == ["gateway.ops_port=9102"]
    later = GatewayProcess(["gateway.ops_port=9102", "gateway.ops_port=9002"], tmp_path / "log", port=9100)
    assert later.ops_url == "http://127.0.0.1:9002"  # the last one wins, as with --set
    off = GatewayProcess(["gateway.ops_port=0"], tmp_path / "log", port=9100)
    assert off.ops_url is None and off.metrics_url is None
