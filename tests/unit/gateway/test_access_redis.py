"""Two AccessPolicy instances (as two gateway processes) sharing one real
redis-server enforce ONE request limit, ONE token limit, one per-key and one
global concurrency cap; a crashed gateway's slots expire, a live one's don't.

Real time here (Redis keeps its own clock), with windows long enough that a
loaded CI machine cannot slip a request past them."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.admission.access import AccessPolicy
from gateway.admission.keys import KeyStore
from gateway.config import GatewayConfig, LimitsConfig, TierConfig
from gateway.core.errors import GatewayError
from tests.unit.gateway.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)


def _fleet(
    server: RedisServer,
    tmp_path: Path,
    tier: TierConfig,
    *,
    tokens_window_s: int = 60,
    slot_ttl_s: float = 30.0,
    max_concurrent_requests: int = 512,
) -> tuple[list[AccessPolicy], list[str]]:
    """Two policies on one Redis and one key store, and two keys of tier t."""
    store = KeyStore(tmp_path / "keys.json")
    keys = [store.create("t").key, store.create("t").key]
    config = GatewayConfig(
        keys_file=str(store.path),
        redis_url=server.url,
        tiers={"t": tier},
        limits=LimitsConfig(max_concurrent_requests=max_concurrent_requests),
    )
    prefix = f"test-{uuid.uuid4().hex[:8]}"  # one module-wide server: tests must not share counters
    policies = [
        AccessPolicy(
            config,
            registry=CollectorRegistry(),
            tokens_window_s=tokens_window_s,
            redis_prefix=prefix,
            slot_ttl_s=slot_ttl_s,
        )
        for _ in range(2)
    ]
    return policies, keys


async def _close(policies: list[AccessPolicy]) -> None:
    for policy in policies:
        await policy.aclose()


def test_two_gateways_enforce_one_qps_limit(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    # 0.6/s = 3 per 5 s: long enough that the sequence below runs inside one window
    (a, b), (key, _) = _fleet(redis_server, tmp_path, TierConfig(requests_per_second=0.6))

    async def go() -> None:
        callers = [await a.authenticate(f"Bearer {key}"), await b.authenticate(f"Bearer {key}")]
        admitted = []
        for policy, caller in [(a, callers[0]), (b, callers[1]), (a, callers[0])]:
            admitted.append(await policy.admit(caller, 1))
        assert admitted[-1].headers["x-ratelimit-remaining-requests"] == "0"
        for policy, caller in [(b, callers[1]), (a, callers[0])]:
            with pytest.raises(GatewayError) as info:
                await policy.admit(caller, 1)
            assert info.value.status == 429 and 0 < int(info.value.headers["retry-after"]) <= 5
            assert info.value.headers["x-ratelimit-limit-requests"] == "3"
        for admission in admitted:
            await admission.release()
        await _close([a, b])

    asyncio.run(go())


def test_two_gateways_enforce_one_tps_limit_with_debt(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    # 10 tokens/s over 5 s: 50 tokens for the whole fleet
    (a, b), (key, _) = _fleet(redis_server, tmp_path, TierConfig(tokens_per_second=10), tokens_window_s=5)

    async def go() -> None:
        ca, cb = await a.authenticate(f"Bearer {key}"), await b.authenticate(f"Bearer {key}")
        first = await b.admit(cb, 20)  # 20 of 50 on gateway b
        with pytest.raises(GatewayError) as info:
            await a.admit(ca, 31)  # gateway a sees b's 20
        assert info.value.status == 429 and info.value.headers["x-ratelimit-remaining-tokens"] == "30"
        stream = await a.admit(ca, 30)  # exactly the rest
        for _ in range(100):  # a long stream on a: never cut, batched writes
            await stream.add_tokens(1)
        await stream.release()
        await first.release()
        for policy, caller in [(a, ca), (b, cb)]:  # the debt blocks the key on both gateways
            with pytest.raises(GatewayError) as info:
                await policy.admit(caller, 1)
            headers = info.value.headers
            assert info.value.status == 429 and headers["x-ratelimit-remaining-tokens"] == "0"
            # 150 in a 5 s window, budget 50: free again 5 to 10 s from now
            assert 5 <= int(headers["retry-after"]) <= 10
        await _close([a, b])

    asyncio.run(go())


def test_two_gateways_share_the_concurrency_caps(redis_server: RedisServer, tmp_path: Path) -> None:  # noqa: F811
    (a, b), (key, other) = _fleet(
        redis_server, tmp_path, TierConfig(max_concurrent_requests=1), max_concurrent_requests=2
    )

    async def go() -> None:
        ca, cb, co = (
            await a.authenticate(f"Bearer {key}"),
            await b.authenticate(f"Bearer {key}"),
            await b.authenticate(f"Bearer {other}"),
        )
        held = await a.admit(ca, 1)
        with pytest.raises(GatewayError) as info:
            await b.admit(cb, 1)  # the key's one slot is held on a
        assert info.value.status == 429
        other_held = await b.admit(co, 1)  # fleet total 2 of 2
        await held.release()
        await held.release()  # idempotent
        again = await b.admit(cb, 1)
        await other_held.release()
        await again.release()
        await _close([a, b])

    asyncio.run(go())


def test_a_crashed_gateways_slots_expire_and_a_live_ones_are_renewed(
    redis_server: RedisServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    (a, b), (key, _) = _fleet(redis_server, tmp_path, TierConfig(max_concurrent_requests=1), slot_ttl_s=0.6)

    async def go() -> None:
        ca, cb = await a.authenticate(f"Bearer {key}"), await b.authenticate(f"Bearer {key}")
        held = await a.admit(ca, 1)
        await asyncio.sleep(1.5)  # 2.5 TTLs: alive because a renews it
        with pytest.raises(GatewayError):
            await b.admit(cb, 1)
        await a.aclose()  # a "crashes": no release, no more renewal
        del held
        await asyncio.sleep(0.8)
        await (await b.admit(cb, 1)).release()  # the slot expired in Redis
        await b.aclose()

    asyncio.run(go())
