"""Migration of a stream whose replica dies or stalls after its first token,
the orphan left on a stalled replica stopped by key, and tier pools; with
scripted engines under the real client library (no Triton)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from client import AsyncLLMClient, GenerationOptions, ServerConnectionError
from gateway.app import create_app
from gateway.config import FleetConfig, GatewayConfig, ReplicaConfig, TierConfig
from gateway.core.upstream import UpstreamFailure
from gateway.fleet.fleet import Fleet
from gateway.fleet.load import LoadReading
from gateway.fleet.pools import check_pools, pool_for
from gateway.fleet.replica import Replica
from gateway.fleet.replica_client import ReplicaClient, client_config
from tests.unit.gateway.asgi_driver import call
from tests.unit.gateway.openai_fakes import AUTH, HANG, FakePolicy, FakeTransport, ev


def fleet_of(
    scripts: dict[str, object], dedicated: dict[str, tuple[str, ...]] | None = None, **fleet: Any
) -> tuple[Fleet, dict[str, FakeTransport]]:
    dedicated = dedicated or {}
    settings = GatewayConfig(
        fleet=FleetConfig(
            replicas={n: ReplicaConfig(grpc_url=f"{n}:1", dedicated_to=dedicated.get(n, ())) for n in scripts},
            routing_policy="round_robin",
            **fleet,
        )
    )
    transports = {n: FakeTransport(s) for n, s in scripts.items()}
    replicas = [
        Replica.build(
            n,
            settings.fleet.replicas[n],
            settings,
            ReplicaClient(client=AsyncLLMClient(client_config(f"{n}:1"), transport=transports[n])),
        )
        for n in scripts
    ]
    return Fleet(settings, replicas), transports


def dies_after(*ids: int):
    def script(model, values, request_id):
        return [*(ev(f"t{i}", ids=(i,)) for i in ids), ServerConnectionError("connection reset by peer")]

    return script


def stalls_after(*ids: int):
    def script(model, values, request_id):
        return [*(ev(f"t{i}", ids=(i,)) for i in ids), HANG]

    return script


def continues(model, values, request_id):
    """Goes on from what it was given: the next two ids, the last final."""
    start = (values.get("continuation_ids") or [0])[-1] + 1
    return [ev(f"t{start}", ids=(start,)), ev(f"t{start + 1}", ids=(start + 1,), finish="length", final=True)]


async def _run(fleet: Fleet, options: GenerationOptions | None = None) -> tuple[list, object]:
    stream = await fleet.start("ensemble", "hi", options or GenerationOptions(max_tokens=16, temperature=0))
    events = [stream.first]
    try:
        async for event in stream.rest():
            events.append(event)
    finally:
        await stream.aclose()
    return events, stream


def test_a_stream_whose_replica_dies_continues_on_another_with_the_tokens_so_far():
    fleet, transports = fleet_of({"a": dies_after(1, 2), "b": continues})
    events, stream = asyncio.run(_run(fleet))
    assert [e.text for e in events] == ["t1", "t2", "t3", "t4"] and events[-1].final
    sent = transports["b"].opened[0][1]
    assert list(sent["continuation_ids"]) == [1, 2] and sent["max_tokens"] == 16, "the budget stays the caller's"
    assert stream.replica.name == "b" and stream.migrations == 1
    assert fleet.by_name["a"].health.failures == 1 and fleet.in_flight() == 0


def test_a_stalled_stream_moves_and_its_orphan_is_stopped_by_key_once_the_replica_answers():
    fleet, transports = fleet_of({"a": stalls_after(7), "b": continues}, stall_timeout_s=0.2)

    async def scenario():
        started = time.monotonic()
        events, _ = await _run(fleet)
        moved_after = time.monotonic() - started
        deadline = time.monotonic() + 10
        while len(fleet.orphans) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return events, moved_after, len(fleet.orphans)

    events, moved_after, orphans_left = asyncio.run(scenario())
    assert [e.text for e in events] == ["t7", "t8", "t9"]
    assert 0.2 <= moved_after < 5, f"moved after {moved_after:.2f} s"
    key = transports["a"].opened[0][1]["request_key"]
    assert orphans_left == 0 and transports["a"].stops and all(s[2] == key for s in transports["a"].stops)
    assert not transports["b"].stops, "the request that finished is not stopped"


def test_a_stream_moves_at_most_migrate_attempts_times_then_the_caller_gets_the_failure():
    fleet, _ = fleet_of({"a": dies_after(1), "b": dies_after(2), "c": dies_after(3)}, migrate_attempts=1)
    with pytest.raises(UpstreamFailure):
        asyncio.run(_run(fleet))
    assert fleet.in_flight() == 0


def test_nothing_moves_when_the_budget_is_spent_already():
    fleet, transports = fleet_of({"a": dies_after(1, 2), "b": continues})
    events, _ = asyncio.run(_run(fleet, GenerationOptions(max_tokens=2)))
    assert events[-1].final and events[-1].finish_reason == "length" and not transports["b"].opened


def test_through_the_app_the_caller_sees_one_whole_stream_with_exact_usage():
    settings = GatewayConfig(
        fleet=FleetConfig(routing_policy="round_robin", replicas={"a": ReplicaConfig("a:1"), "b": ReplicaConfig("b:1")})
    )
    app = create_app(settings, FakePolicy())
    for replica, script in zip(app.state.fleet.replicas, (dies_after(1, 2), continues)):
        replica.upstream = ReplicaClient(client=AsyncLLMClient(client_config("x:1"), transport=FakeTransport(script)))
    body = json.dumps(
        {
            "model": "ensemble",
            "prompt": "hi",
            "stream": True,
            "max_tokens": 8,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    exchange = asyncio.run(call(app.state.asgi, "POST", "/v1/completions", headers=AUTH, body=body))
    events = exchange.data()
    assert exchange.status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "t1t2t3t4"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_tier_pools_keep_free_keys_off_paid_replicas_and_spill_over_by_rule():
    tiers = {
        "free": TierConfig(priority=0),
        "paid": TierConfig(priority=10, spill_over="when_down"),
        "gold": TierConfig(priority=20, spill_over="never"),
        "busy": TierConfig(spill_over="when_busy"),
    }
    settings = GatewayConfig(
        tiers=tiers,
        fleet=FleetConfig(
            replicas={
                "p": ReplicaConfig("p:1", metrics_url="http://p/metrics", dedicated_to=("paid", "gold", "busy")),
                "s": ReplicaConfig("s:1"),
            }
        ),
    )
    replicas = [Replica.build(n, c, settings, upstream=object()) for n, c in settings.fleet.replicas.items()]  # type: ignore[arg-type]
    paid, shared = replicas
    now = time.monotonic()
    paid.load = LoadReading(waiting=0, at=now)

    def pool(tier: str, routable=replicas):
        chosen, spilled = pool_for(tier, routable, replicas, settings, now)
        return [r.name for r in chosen], spilled

    assert pool("free") == (["s"], False), "free keys never reach a paid replica"
    assert pool("paid") == (["p"], False) and pool("busy") == (["p"], False)
    assert pool("paid", [shared]) == (["s"], True), "when_down: its own replica is out"
    assert pool("gold", [shared]) == ([], False), "never: no spill-over"
    assert pool("free", [paid]) == ([], False)
    paid.load = LoadReading(waiting=3, at=now)
    assert pool("busy") == (["p", "s"], True) and pool("paid") == (["p"], False)
    with pytest.raises(ValueError, match=r"gateway\.fleet\.replicas\.p\.dedicated_to: no tier named nope"):
        check_pools(
            settings, [Replica.build("p", ReplicaConfig("p:1", dedicated_to=("nope",)), settings, upstream=object())]
        )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"gateway\.tiers\.x\.spill_over"):
        check_pools(GatewayConfig(tiers={"x": TierConfig(spill_over="sometimes")}), [])
