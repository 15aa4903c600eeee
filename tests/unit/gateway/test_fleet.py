"""The fleet's parts without Triton: load readings, the prefix index, health
(ejection, the last replica kept, re-admission with a growing back-off), the
routing policies, failover before the first token, the inference probe's
verdicts, and the fleet behind the real app (drain, admin endpoints)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from client import AsyncLLMClient, RequestError
from gateway.app import create_app
from gateway.config import FleetConfig, GatewayConfig, ReplicaConfig
from gateway.core.errors import GatewayError
from gateway.fleet.fleet import Fleet, prompt_text
from gateway.fleet.health import Health
from gateway.fleet.load import LoadReading, parse_load
from gateway.fleet.prefix import PrefixIndex, block_hashes
from gateway.fleet.probe import probe_once
from gateway.fleet.replica import Replica
from gateway.fleet.replica_client import ReplicaClient, client_config
from gateway.fleet.router import Router, RouteRequest
from tests.unit.gateway.asgi_driver import call
from tests.unit.gateway.openai_fakes import AUTH, FakePolicy, FakeTransport, overloaded_script, simple_script

EXPOSITION = """# TYPE llm_num_requests_waiting gauge
llm_num_requests_waiting{model="python_llm",version="1"} 3
# TYPE llm_num_requests_running gauge
llm_num_requests_running{model="python_llm",version="1"} 5
# TYPE llm_kv_cache_blocks_used gauge
llm_kv_cache_blocks_used{model="python_llm",version="1"} 40
# TYPE llm_kv_cache_blocks_capacity gauge
llm_kv_cache_blocks_capacity{model="python_llm",version="1"} 160
"""


def test_a_load_reading_from_the_engines_metrics():
    reading = parse_load(EXPOSITION, at=100.0)
    assert (reading.waiting, reading.running, reading.kv_utilisation) == (3, 5, 0.25)
    assert not reading.stale(3.0, now=101.0) and reading.stale(3.0, now=104.0)
    assert LoadReading().stale(3.0), "never scraped counts as stale"
    with pytest.raises(ValueError):
        parse_load("# nothing here\n", at=1.0)


def test_prefix_blocks_chain_and_the_index_forgets_the_oldest():
    system = "You are a helpful assistant. " * 40
    one, two = block_hashes(system + "Question one?"), block_hashes(system + "Another, different question")
    assert one[:4] == two[:4] and len(one) >= 4
    assert block_hashes("x" * 255) == [] and block_hashes("y" + system)[0] != one[0]
    shared = next(i for i, (x, y) in enumerate(zip(one, two)) if x != y) if one != two[: len(one)] else len(one)
    index = PrefixIndex(capacity_blocks=len(one))
    index.record(one)
    assert index.matched(one) == len(one) and index.matched(two) == shared > 0
    index.record(block_hashes("z" * 256 * 3))
    assert index.matched(one) < len(one), "the LRU bound was not applied"


def test_health_ejects_after_consecutive_failures_never_the_last_and_backs_off():
    now = [0.0]
    health = Health(eject_after_failures=2, readmit_after_successes=2, backoff_s=10.0, clock=lambda: now[0])
    assert not health.failed("x", may_eject=True)
    assert not health.failed("x", may_eject=False), "the last replica is never ejected"
    assert health.failed("x", may_eject=True) and health.ejected
    assert not health.succeeded() and not health.succeeded(), "back before its ejection's minimum length"
    now[0] = 10.5
    assert health.succeeded() and not health.ejected
    health.failed("x", True)
    health.failed("x", True)
    assert health.ejected and health.ejected_until == pytest.approx(now[0] + 20.0), "the back-off doubles"


def replica(name: str, *, waiting: float = 0, kv: float = 0.0, at: float | None = None) -> Replica:
    config = GatewayConfig()
    r = Replica.build(name, ReplicaConfig(grpc_url=f"{name}:1"), config, upstream=object())  # type: ignore[arg-type]
    r.load = LoadReading(
        waiting=waiting, running=0, kv_used=kv * 100, kv_capacity=100, at=time.monotonic() if at is None else at
    )
    return r


def test_least_load_prefers_the_idle_replica_and_stale_metrics_count_as_saturated():
    router = Router(GatewayConfig(fleet=FleetConfig(routing_policy="least_load")))
    busy, idle = replica("busy", waiting=6, kv=0.8), replica("idle", waiting=0, kv=0.1)
    assert router.pick([busy, idle], RouteRequest("hi")).replica is idle
    silent = replica("silent", waiting=0, kv=0.0, at=1.0)  # last scraped long ago
    assert router.pick([silent, busy], RouteRequest("hi")).replica is busy


def test_prefix_aware_sends_a_shared_prefix_where_it_went_before_unless_that_replica_is_swamped():
    router = Router(GatewayConfig(fleet=FleetConfig(routing_policy="prefix_aware")))
    a, b = replica("a"), replica("b")
    system = "You are the support agent of a shipping company. " * 30
    first = router.pick([a, b], RouteRequest(system + "Where is my parcel?"))
    again = router.pick([a, b], RouteRequest(system + "Can I change the address?"))
    assert again.replica is first.replica and again.reason == "prefix" and again.prefix_blocks > 0
    home = first.replica
    home.load = replica("x", waiting=50, kv=0.97).load
    home.in_flight = 50
    other = b if home is a else a
    assert router.pick([a, b], RouteRequest(system + "Refund?")).replica is other


def test_round_robin_cycles_and_session_affinity_counts():
    router = Router(GatewayConfig(fleet=FleetConfig(routing_policy="round_robin")))
    a, b = replica("a"), replica("b")
    assert [router.pick([a, b], RouteRequest("q")).replica.name for _ in range(4)] == ["a", "b", "a", "b"]
    sticky = Router(GatewayConfig(fleet=FleetConfig(routing_policy="prefix_aware", weight_session=5.0)))
    home = sticky.pick([a, b], RouteRequest("short", session="u1")).replica
    assert all(sticky.pick([a, b], RouteRequest("other", session="u1")).replica is home for _ in range(5))


def fleet_of(scripts: dict[str, object], **fleet: Any) -> tuple[Fleet, dict[str, FakeTransport]]:
    settings = GatewayConfig(
        fleet=FleetConfig(replicas={n: ReplicaConfig(grpc_url=f"{n}:1") for n in scripts}, **fleet)
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


def _engine_error_script(model, values, request_id):
    return [RequestError("Stub process 'python_llm_0_0' is not healthy.")]


def _bad_input_script(model, values, request_id):
    return [RequestError("in ensemble 'ensemble', max_tokens: must be > 0")]


# neither counts against the replica: overload is not a failure, and the
# probe, not one request's error, judges whether a replica is sick
@pytest.mark.parametrize("refusal", [overloaded_script, _engine_error_script], ids=["overloaded", "engine_error"])
def test_a_refusal_before_the_first_token_fails_over_to_another_replica(refusal):
    fleet, transports = fleet_of({"a": refusal, "b": simple_script("ok")}, routing_policy="round_robin")

    async def scenario():
        stream = await fleet.start("ensemble", "hi", _options())
        await stream.aclose()
        return stream

    stream = asyncio.run(scenario())
    assert stream.replica.name == "b" and stream.first.text == "ok"
    assert len(transports["a"].opened) == 1 and len(transports["b"].opened) == 1
    assert fleet.in_flight() == 0 and not fleet.by_name["a"].health.failures


def test_bad_input_is_not_tried_on_another_replica_and_an_error_everywhere_is_a_502():
    fleet, transports = fleet_of({"a": _bad_input_script, "b": _bad_input_script}, routing_policy="round_robin")
    with pytest.raises(GatewayError) as refused:
        asyncio.run(fleet.start("ensemble", "hi", _options()))
    assert refused.value.status == 400 and refused.value.param == "max_tokens"
    assert len(transports["a"].opened) + len(transports["b"].opened) == 1
    fleet, _ = fleet_of({"a": _engine_error_script, "b": _engine_error_script})
    with pytest.raises(GatewayError) as failed:
        asyncio.run(fleet.start("ensemble", "hi", _options()))
    assert failed.value.status == 502 and failed.value.code == "upstream_error"


def test_when_every_replica_refuses_the_caller_gets_the_503():
    fleet, _ = fleet_of({"a": overloaded_script, "b": overloaded_script})
    with pytest.raises(GatewayError) as refused:
        asyncio.run(fleet.start("ensemble", "hi", _options()))
    assert refused.value.status == 503 and refused.value.code == "overloaded"


def _options():
    from client import GenerationOptions

    return GenerationOptions(max_tokens=4, request_id="r1")


@dataclass
class FakeProbeClient:
    ready_after_s: float = 0.0
    answer: list[int] | Exception | None = None

    async def ready(self) -> bool:
        await asyncio.sleep(self.ready_after_s)
        return True

    async def generate(self, prompt, options, model):
        if isinstance(self.answer, Exception):
            raise self.answer

        @dataclass
        class Result:
            output_ids: list[int]
            error: str | None = None

        return Result(self.answer or [])


@dataclass(frozen=True)
class Golden:
    prompt: str = "The capital of France is"
    max_tokens: int = 3
    output_ids: tuple[int, ...] = (1, 2, 3)


@pytest.mark.parametrize(
    "client, outcome",
    [
        (FakeProbeClient(answer=[1, 2, 3]), "ok"),
        (FakeProbeClient(answer=[1, 2, 4]), "wrong_answer"),
        (FakeProbeClient(answer=RequestError("overloaded: the waiting queue is full (9)")), "overloaded"),
        (FakeProbeClient(ready_after_s=5.0), "ready_timeout"),
    ],
)
def test_the_inference_probe_judges_the_answer_not_just_readiness(client, outcome):
    verdict = asyncio.run(probe_once(client, Golden(), ready_timeout_s=0.1, answer_timeout_s=1.0))
    assert verdict == outcome


def test_the_prompt_text_of_a_chat_is_its_turns_in_order():
    from client import GenerationOptions

    options = GenerationOptions(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert prompt_text("", options) == "<system>S<user>U"


def test_draining_the_gateway_refuses_new_posts_and_fails_readiness():
    app = create_app(
        GatewayConfig(),
        FakePolicy(),
        ReplicaClient(client=AsyncLLMClient(client_config("x:1"), transport=FakeTransport(simple_script("a")))),
    )
    body = json.dumps({"model": "ensemble", "prompt": "hi"}).encode()

    async def scenario():
        ok = await call(app.state.asgi, "GET", "/health")
        app.state.drain.begin()
        health = await call(app.state.asgi, "GET", "/health")
        refused = await call(app.state.asgi, "POST", "/v1/completions", headers=AUTH, body=body)
        return ok, health, refused

    ok, health, refused = asyncio.run(scenario())
    assert ok.status == 200 and health.status == 503
    assert refused.status == 503 and refused.headers["retry-after"] == "1" and b"draining" in refused.body


def test_admin_endpoints_need_the_admin_key_and_drain_a_replica(tmp_path):
    key_file = tmp_path / "admin_key"
    key_file.write_text("s3cret-admin-key")
    settings = GatewayConfig(
        admin_key_file=str(key_file),
        fleet=FleetConfig(
            routing_policy="round_robin", replicas={"a": ReplicaConfig("a:1"), "b": ReplicaConfig("b:1")}
        ),
    )
    app = create_app(settings, FakePolicy())
    admin = {"Authorization": "Bearer s3cret-admin-key", "Content-Length": "0"}

    async def scenario():
        ops = app.state.ops_asgi  # the ops listener's app: /admin is nowhere else
        denied = await call(ops, "POST", "/admin/replicas/a/drain", headers={**AUTH, "Content-Length": "0"})
        drained = await call(ops, "POST", "/admin/replicas/a/drain", headers=admin)
        listed = await call(ops, "GET", "/admin/replicas", headers=admin)
        missing = await call(ops, "POST", "/admin/replicas/zz/drain", headers=admin)
        await app.state.fleet.aclose()
        return denied, drained, listed, missing

    denied, drained, listed, missing = asyncio.run(scenario())
    assert denied.status == 401 and drained.status == 200 and missing.status == 404
    assert json.loads(drained.body)["draining"] is True
    states = {r["name"]: r["routable"] for r in json.loads(listed.body)["replicas"]}
    assert states == {"a": False, "b": True}
    assert [r.name for r in app.state.fleet.routable()] == ["b"]


def test_a_replica_dying_mid_stream_ends_the_stream_with_an_error_event_and_counts_against_it():
    from client import ServerConnectionError
    from tests.unit.gateway.openai_fakes import ev

    died = lambda *a: [ev("Hel", ids=(1,)), ServerConnectionError("connection reset")]  # noqa: E731
    settings = GatewayConfig(fleet=FleetConfig(routing_policy="round_robin", replicas={"a": ReplicaConfig("a:1")}))
    transport = FakeTransport(died)
    replica_a = Replica.build(
        "a",
        settings.fleet.replicas["a"],
        settings,
        ReplicaClient(client=AsyncLLMClient(client_config("a:1"), transport=transport)),
    )
    app = create_app(settings, FakePolicy())
    app.state.fleet.replicas[:] = [replica_a]
    app.state.fleet.by_name = {"a": replica_a}
    body = json.dumps({"model": "ensemble", "prompt": "hi", "stream": True}).encode()
    exchange = asyncio.run(call(app.state.asgi, "POST", "/v1/completions", headers=AUTH, body=body))
    events = exchange.data()
    assert exchange.status == 200 and json.loads(events[-1])["error"]["code"] == "upstream_error"
    assert "[DONE]" not in events
    assert replica_a.health.failures == 1 and replica_a.in_flight == 0


def test_a_wrong_probe_answer_ejects_at_once_unless_it_is_the_last_replica():
    health = Health(eject_after_failures=3, readmit_after_successes=2, backoff_s=1.0)
    assert not health.failed("probe_wrong_answer", may_eject=False, decisive=True), "never the last replica"
    other = Health(eject_after_failures=3, readmit_after_successes=2, backoff_s=1.0)
    assert other.failed("probe_wrong_answer", may_eject=True, decisive=True) and other.ejected


def test_the_routable_gauge_says_what_routing_does_a_replica_not_yet_proven_takes_no_callers():
    from gateway.ops.metrics import REPLICA_ROUTABLE

    fleet, _ = fleet_of({"p": simple_script("ok"), "q": simple_script("ok")})
    fleet.golden = Golden()

    def gauges() -> dict[str, float]:
        return {n: REPLICA_ROUTABLE.labels(replica=n)._value.get() for n in ("p", "q")}

    fleet._publish()
    assert gauges() == {"p": 0, "q": 0}, "before any probe answered, a caller waits: nobody takes it yet"
    fleet.succeeded(fleet.by_name["p"])  # p answered its first probe; q has not yet
    assert [r.name for r in fleet.routable()] == ["p"] and gauges() == {"p": 1, "q": 0}
    fleet.succeeded(fleet.by_name["q"])
    assert gauges() == {"p": 1, "q": 1}
    fleet.set_draining("p", True)
    assert gauges() == {"p": 0, "q": 1}


def test_the_gauges_are_published_when_what_a_caller_gets_changes_not_on_every_good_probe(monkeypatch):
    fleet, _ = fleet_of({"p": simple_script("ok"), "q": simple_script("ok")})  # q: p may be ejected
    fleet.golden = Golden()
    fleet.succeeded(fleet.by_name["q"])
    published = []
    monkeypatch.setattr(fleet, "_publish", lambda: published.append(1))
    p = fleet.by_name["p"]
    fleet.succeeded(p)  # first good answer: proven, takes callers now
    assert len(published) == 1
    for _ in range(5):
        fleet.succeeded(p)  # steady: nothing a caller gets changes
    assert len(published) == 1
    for _ in range(fleet.config.fleet.eject_after_failures):
        fleet.failed(p, "probe", decisive=True)
    ejected = len(published)
    assert p.health.ejected and ejected >= 2
    p.health.ejected_until = 0.0  # its back-off over
    for _ in range(fleet.config.fleet.readmit_after_successes):
        fleet.succeeded(p)
    assert not p.health.ejected and len(published) == ejected + 1  # the re-admission
