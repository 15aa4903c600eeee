"""Each degradation level's effect through the whole app (the real routes,
the real client library, a scripted engine), the level set directly: the
signals and the controller are tested on their own (test_degrade_controller).
Level 1 caps every tier's max_tokens, 2 sheds the lowest tier (429 +
Retry-After, on every door), 3 streams the next tier in one piece, 4 sends
engine requests to the fallback model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from client import AsyncLLMClient
from gateway.app import create_app
from gateway.config import DegradationConfig, GatewayConfig
from gateway.core.errors import GatewayError
from gateway.core.policy import Caller
from gateway.degrade import DegradingPolicy, build_degradation
from gateway.fleet.replica_client import ReplicaClient, client_config
from gateway.ops.metrics import REGISTRY
from tests.unit.gateway.openai_fakes import FakePolicy, FakeTransport, Script
from tests.unit.gateway.test_triton_grpc import Door, serve
from tests.unit.gateway.triton_fakes import engine

FREE, PAID = "sk-free", "sk-paid"
CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
ADMIN_KEY = "admin-key-for-the-degradation-tests-0123"


class TieredPolicy(FakePolicy):
    """One key per tier of the settings (free: the lowest priority, paid)."""

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__()
        self.tiers = config.tiers

    async def authenticate(self, authorization: str | None) -> Caller:
        name = {f"Bearer {FREE}": "free", f"Bearer {PAID}": "paid"}.get(authorization or "")
        if name is None:
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
        return Caller(key_id=f"k-{name}", tier_name=name, tier=self.tiers[name])


class App:
    def __init__(self, level: int, script: Script | None = None, **degradation: Any) -> None:
        self.config = GatewayConfig(degradation=DegradationConfig(**degradation))
        self.transport = FakeTransport(script or engine("Hel", "lo", ", ", "world"))
        self.policy = TieredPolicy(self.config)
        client = AsyncLLMClient(client_config("127.0.0.1:1"), transport=self.transport)
        app = create_app(self.config, self.policy, ReplicaClient(client=client))
        self.degradation = app.state.degradation
        self.degradation.controller.level = level
        self.asgi = app.state.asgi

    def post(self, path: str, body: dict, key: str = PAID, **headers: str) -> httpx.Response:
        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.asgi), base_url="http://gw") as c:
                return await c.post(path, json=body, headers={"Authorization": f"Bearer {key}", **headers})

        return asyncio.run(go())

    def sent(self, index: int = -1) -> tuple[str, dict[str, Any]]:
        model, values, _ = self.transport.opened[index]
        return model, values


def sse_payloads(text: str) -> list[str]:
    return [
        line[len("data: ") :] for block in text.split("\n\n") for line in block.split("\n") if line.startswith("data: ")
    ]


def test_level_0_leaves_requests_alone():
    app = App(0)
    assert app.post("/v1/chat/completions", {**CHAT, "max_tokens": 1000}).status_code == 200
    assert app.sent()[1]["max_tokens"] == 1000
    assert app.post("/v1/chat/completions", CHAT, key=FREE).status_code == 200


def test_level_1_caps_every_tiers_max_tokens_on_every_route():
    app = App(1, max_tokens_cap=100)
    assert app.post("/v1/chat/completions", {**CHAT, "max_tokens": 1000}).status_code == 200
    assert app.sent()[1]["max_tokens"] == 100
    assert app.post("/v1/completions", {"model": "ensemble", "prompt": "Say"}, key=FREE).status_code == 200
    assert app.sent()[1]["max_tokens"] == 100  # free's own cap (512) lowered too
    assert app.post("/v1/chat/completions", {**CHAT, "max_tokens": 20}).status_code == 200
    assert app.sent()[1]["max_tokens"] == 20  # a smaller request stays as it is
    response = app.post("/v2/models/ensemble/generate", {"text_input": "Say", "max_tokens": 1000})
    assert response.status_code == 200 and app.sent()[1]["max_tokens"] == 100
    # a tier's own lower cap stays
    assert (
        App(1, max_tokens_cap=1000)
        .post("/v1/completions", {"model": "ensemble", "prompt": "Say"}, key=FREE)
        .status_code
        == 200
    )


def test_level_2_sheds_the_lowest_tier_with_429_and_retry_after_before_admission():
    app = App(2, exit_dwell_s=30.0)
    before = REGISTRY.get_sample_value("gateway_degradation_shed_total", {"tier": "free"}) or 0.0
    response = app.post("/v1/chat/completions", CHAT, key=FREE)
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "degraded_overload" and error["type"] == "rate_limit_error"
    assert "overload" in error["message"] and "free" in error["message"]
    # one exit dwell at least before the level can fall below 2
    assert int(response.headers["retry-after"]) == 30 and int(response.headers["retry-after-ms"]) >= 29_000
    assert app.transport.opened == [] and app.policy.admissions == []  # refused before the policy's admission
    assert REGISTRY.get_sample_value("gateway_degradation_shed_total", {"tier": "free"}) == before + 1
    # Triton's route: its own error shape, the same status and header
    triton = app.post("/v2/models/ensemble/generate", {"text_input": "Say"}, key=FREE)
    assert triton.status_code == 429 and list(triton.json()) == ["error"] and "retry-after" in triton.headers
    # the paid tier is served, capped
    assert app.post("/v1/chat/completions", {**CHAT, "max_tokens": 1000}).status_code == 200
    assert app.sent()[1]["max_tokens"] == 256


def test_level_2_sheds_on_the_grpc_door_as_resource_exhausted_with_retry_after():
    config = GatewayConfig()
    degradation = build_degradation(config)
    assert degradation is not None
    degradation.controller.level = 2

    async def shed(d: Door) -> None:
        async with grpc.aio.insecure_channel(d.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="ensemble")
            request.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ModelInfer(request, metadata=(("authorization", f"Bearer {FREE}"),))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry-after" in dict(caught.value.trailing_metadata())

    door = serve(engine("x"), shed, DegradingPolicy(TieredPolicy(config), degradation))  # type: ignore[arg-type]
    assert door.transport.opened == []


def test_level_3_streams_the_next_tier_in_one_piece_on_chat_and_completions():
    app = App(3)
    response = app.post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    content, usage = [json.loads(p) for p in payloads[:-1]]
    assert content["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": "Hello, world"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert app.sent()[1]["stream"] is False  # the engine sent one whole answer
    completion = app.post("/v1/completions", {"model": "ensemble", "prompt": "Say", "stream": True, "n": 2})
    chunks = [json.loads(p) for p in sse_payloads(completion.text)[:-1]]
    assert sorted((c["choices"][0]["index"], c["choices"][0]["text"]) for c in chunks) == [
        (0, "Hello, world"),
        (1, "Hello, world"),
    ]
    # below level 3 the same request streams its deltas
    streamed = App(2).post("/v1/chat/completions", {**CHAT, "stream": True})
    assert len(sse_payloads(streamed.text)) == 5


def test_level_3_one_piece_on_the_responses_api_and_triton_generate_stream():
    app = App(3)
    response = app.post("/v1/responses", {"model": "ensemble", "input": "Hi", "stream": True})
    events = [json.loads(p) for p in sse_payloads(response.text)]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["Hello, world"] and events[-1]["type"] == "response.incomplete"
    triton = app.post("/v2/models/ensemble/generate_stream", {"text_input": "Say", "stream": True})
    assert [e["text_output"] for e in map(json.loads, sse_payloads(triton.text))] == ["Hello, world"]
    assert all(values["stream"] is False for _, values, _ in app.transport.opened)


def test_level_4_sends_engine_requests_to_the_fallback_model():
    app = App(4, fallback_model="llm_small")
    assert app.degradation.controller.max_level == 4
    response = app.post("/v1/chat/completions", CHAT)
    assert response.status_code == 200 and response.json()["model"] == "ensemble"  # the caller's name stays
    assert app.sent()[0] == "llm_small"
    assert App(3, fallback_model="llm_small").post("/v1/chat/completions", CHAT).status_code == 200


def test_degradation_off_and_the_admin_view(tmp_path: Path):
    key_file = tmp_path / "admin_key"
    key_file.write_text(ADMIN_KEY)
    off = create_app(
        GatewayConfig(degradation=DegradationConfig(max_level=0), admin_key_file=str(key_file)), FakePolicy()
    )
    assert off.state.degradation is None and isinstance(off.state.policy, FakePolicy)

    async def get(app: Any) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.state.ops_asgi), base_url="http://gw") as c:
            return await c.get("/admin/degradation", headers={"Authorization": f"Bearer {ADMIN_KEY}"})

    assert asyncio.run(get(off)).json() == {"level": 0, "max_level": 0, "enabled": False}
    on = create_app(GatewayConfig(admin_key_file=str(key_file)), FakePolicy())
    view = asyncio.run(get(on)).json()
    assert view["enabled"] is True and view["level"] == 0 and view["max_level"] == 3
    assert view["shed_tiers"] == ["free"] and view["one_piece_tiers"] == ["paid"]
    assert view["signals"]["kv_use"] == {"value": None, "enter": 0.9, "exit": 0.7}
