"""Fakes for the OpenAI routes' unit tests: a Policy (gateway/core/policy.py) with
one good key, and a client-library Transport replaying scripted engine
responses, under the real AsyncLLMClient (so retries, stop-on-cancel and
error handling are the library's own)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from client import AsyncLLMClient, StreamEvent
from client.errors import RequestError
from gateway.app import create_app
from gateway.config import GatewayConfig, TierConfig
from gateway.core.errors import GatewayError
from gateway.core.policy import Caller
from gateway.fleet.replica_client import ReplicaClient, client_config

GOOD_KEY = "sk-test-good"
AUTH = {"Authorization": f"Bearer {GOOD_KEY}"}
HANG = "hang"  # a script item: the engine goes quiet until cancelled


@dataclass(frozen=True)
class Pause:
    """A script item: the engine is silent this long, then goes on."""

    seconds: float


@dataclass
class FakeAdmission:
    headers: dict[str, str] = field(default_factory=lambda: {"x-ratelimit-limit-requests": "10"})
    tokens: list[int] = field(default_factory=list)
    released: int = 0

    async def add_tokens(self, count: int) -> None:
        self.tokens.append(count)

    async def release(self) -> None:
        self.released += 1


OTHER_KEY = "sk-test-other"  # a second valid key (another key id, same tier)


class FakePolicy:
    def __init__(self, tier: TierConfig | None = None) -> None:
        self.tier = tier or TierConfig(priority=7)
        self.admissions: list[FakeAdmission] = []
        self.admitted_prompt_tokens: list[int] = []

    async def authenticate(self, authorization: str | None) -> Caller:
        if authorization == f"Bearer {OTHER_KEY}":
            return Caller(key_id="k2", tier_name="free", tier=self.tier)
        if authorization != f"Bearer {GOOD_KEY}":
            raise GatewayError(401, "Incorrect API key provided.", code="invalid_api_key")
        return Caller(key_id="k1", tier_name="free", tier=self.tier)

    def check_model(self, caller: Caller, model: str) -> None:
        if caller.tier.allowed_models and model not in caller.tier.allowed_models:
            raise GatewayError(403, "not allowed", param="model")

    async def admit(self, caller: Caller, prompt_tokens: int) -> FakeAdmission:
        self.admitted_prompt_tokens.append(prompt_tokens)
        admission = FakeAdmission()
        self.admissions.append(admission)
        return admission


def ev(
    text: str = "",
    ids: tuple[int, ...] = (),
    finish: str | None = None,
    final: bool = False,
    prompt: int | None = 5,
    logprobs: tuple[float, ...] | None = None,
) -> StreamEvent:
    return StreamEvent(
        text=text,
        output_ids=ids,
        finish_reason=finish,
        final=final,
        num_input_tokens=prompt,
        num_output_tokens=len(ids),
        output_log_probs=(logprobs,) if logprobs else None,
    )


Script = Callable[[str, Mapping[str, Any], str], list[Any]]


class FakeStream:
    def __init__(self, items: list[Any]) -> None:
        self.items = list(items)
        self.closed = False

    async def next_event(self) -> StreamEvent | None:
        if not self.items:
            return None
        item = self.items.pop(0)
        while isinstance(item, Pause):
            await asyncio.sleep(item.seconds)
            item = self.items.pop(0)
        if item == HANG:
            await asyncio.Event().wait()
        if isinstance(item, BaseException):
            raise item
        await asyncio.sleep(0)
        return item

    async def aclose(self) -> None:
        self.closed = True


class FakeTransport:
    name = "grpc"

    def __init__(self, script: Script) -> None:
        self.script = script
        self.opened: list[tuple[str, dict[str, Any], str]] = []
        self.stops: list[tuple[str, str, str]] = []

    async def open_stream(self, model: str, values: Mapping[str, Any], request_id: str) -> FakeStream:
        self.opened.append((model, dict(values), request_id))
        return FakeStream(self.script(model, values, request_id))

    async def send_stop(self, model: str, request_id: str, request_key: str) -> None:
        self.stops.append((model, request_id, request_key))

    async def ready(self, timeout_s: float) -> bool:
        return True

    async def aclose(self) -> None:
        pass


def simple_script(*texts: str, finish: str = "stop") -> Script:
    """Each text a response with one token; the last one final."""

    def script(model: str, values: Mapping[str, Any], request_id: str) -> list[Any]:
        events = [ev(t, ids=(100 + i,)) for i, t in enumerate(texts)]
        last = events[-1]
        events[-1] = ev(last.text, ids=last.output_ids, finish=finish, final=True)
        return events

    return script


def overloaded_script(model: str, values: Mapping[str, Any], request_id: str) -> list[Any]:
    return [RequestError("in ensemble 'ensemble', overloaded: the waiting queue is full (9)")]


@dataclass
class Harness:
    transport: FakeTransport
    policy: FakePolicy
    app: Any
    config: GatewayConfig
    streams: Any = None  # the app's StreamRegistry
    stops_in_time: list[tuple[str, str, str]] = field(default_factory=list)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://gw")


def harness(script: Script, tier: TierConfig | None = None, **config: Any) -> Harness:
    transport = FakeTransport(script)
    gateway_config = GatewayConfig(**config)
    client = AsyncLLMClient(client_config("127.0.0.1:1"), transport=transport)
    policy = FakePolicy(tier)
    app = create_app(gateway_config, policy, ReplicaClient(client=client))
    return Harness(transport, policy, app.state.asgi, gateway_config, streams=app.state.streams)
