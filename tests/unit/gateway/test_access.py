"""AccessPolicy on memory storage under a fake clock: 401 / 403, QPS 429 and
recovery, TPS debt after a long stream, per-key and global concurrency, release,
headers, the rejection counter, and failing closed when storage fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.admission.access import AccessPolicy
from gateway.admission.keys import KeyStore, parse_key
from gateway.config import GatewayConfig, LimitsConfig, TierConfig
from gateway.core.errors import GatewayError
from gateway.core.policy import Caller
from tests.unit.gateway.access_fakes import FakeClock, PolicyFactory, clock, make_policy  # noqa: F401  (fixtures)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def refused(call: Callable[[], Awaitable[Any]]) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        await call()
    return info.value


def rejections(registry: CollectorRegistry, kind: str, tier: str = "t") -> float:
    return registry.get_sample_value("gateway_rate_limited_total", {"tier": tier, "kind": kind}) or 0.0


# who


def test_authenticate(make_policy: PolicyFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    policy, key = make_policy()
    store = KeyStore(tmp_path / "keys.json")
    key_id, secret = parse_key(key) or ("", "")
    revoked = store.create("t").key
    store.revoke(parse_key(revoked)[0])  # type: ignore[index]
    stray_tier = store.create("gone").key  # a tier the settings no longer define

    async def go() -> None:
        caplog.set_level(logging.DEBUG)
        caller = await policy.authenticate(f"Bearer {key}")
        assert caller == Caller(key_id=key_id, tier_name="t", tier=policy.config.tiers["t"])
        assert (await policy.authenticate(f"bearer  {key} ")).key_id == key_id

        for header in (None, "", "   "):
            err = await refused(lambda: policy.authenticate(header))  # noqa: B023
            assert (err.status, err.code, err.headers) == (401, "missing_api_key", {"WWW-Authenticate": "Bearer"})
            assert "didn't provide an API key" in err.message

        wrong = [
            f"Basic {key}",
            "Bearer",
            "Bearer sk-nope",
            f"Bearer sk-{'0' * 12}.{secret}",
            f"Bearer sk-{key_id}.{'x' * len(secret)}",
            f"Bearer {revoked}",
            f"Bearer {stray_tier}",
            key,
        ]
        messages = set()
        for header in wrong:
            err = await refused(lambda: policy.authenticate(header))  # noqa: B023
            assert (err.status, err.code, err.headers) == (401, "invalid_api_key", {"WWW-Authenticate": "Bearer"})
            messages.add(err.message)
        assert messages == {"Incorrect API key provided. You can find your API key in your gateway's key list."}

    run(go())
    logged = caplog.text
    assert "'gone', which the settings do not define" in logged  # the server side hears why
    for k in (key, revoked, stray_tier, secret):
        assert k not in logged  # never a key in a log
    assert key_id in logged or parse_key(revoked)[0] in logged  # type: ignore[index]


def test_check_model(make_policy: PolicyFactory) -> None:
    policy, _ = make_policy()
    limited = Caller("k", "t", TierConfig(allowed_models=("ensemble",)))
    policy.check_model(limited, "ensemble")
    policy.check_model(Caller("k", "t", TierConfig()), "anything")  # empty: every model
    with pytest.raises(GatewayError) as info:
        policy.check_model(limited, "big-model")
    err = info.value
    assert (err.status, err.param, err.code) == (403, "model", "model_not_allowed")
    assert "'big-model'" in err.message and err.body()["error"]["type"] == "permission_error"


# limits


def test_qps_429_then_recovery(make_policy: PolicyFactory, clock: FakeClock) -> None:  # noqa: F811
    registry = CollectorRegistry()
    policy, key = make_policy(TierConfig(requests_per_second=2), registry=registry)

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        first = await policy.admit(caller, 5)
        assert first.headers == {
            "x-ratelimit-limit-requests": "2",
            "x-ratelimit-remaining-requests": "1",
            "x-ratelimit-reset-requests": "1.001s",
        }
        await first.release()
        clock.advance(0.25)
        await (await policy.admit(caller, 5)).release()
        err = await refused(lambda: policy.admit(caller, 5))
        assert (err.status, err.code) == (429, "rate_limit_exceeded")
        assert err.headers == {
            "retry-after": "1",
            "retry-after-ms": "751",
            "x-ratelimit-limit-requests": "2",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "751ms",
        }
        assert "2 per 1 s" in err.message
        assert policy.slots.total == 0  # type: ignore[attr-defined]
        clock.advance(0.751)
        await (await policy.admit(caller, 5)).release()  # recovered
        await refused(lambda: policy.admit(caller, 5))

    run(go())
    assert rejections(registry, "qps") == 2


def test_tps_debt_after_a_long_stream_blocks_the_next_request(make_policy: PolicyFactory, clock: FakeClock) -> None:  # noqa: F811
    registry = CollectorRegistry()
    # 10 tokens/s over a 10 s window: a budget of 100
    policy, key = make_policy(TierConfig(tokens_per_second=10), registry=registry, tokens_window_s=10)

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        stream = await policy.admit(caller, 10)
        assert stream.headers == {
            "x-ratelimit-limit-tokens": "100",
            "x-ratelimit-remaining-tokens": "90",
            "x-ratelimit-reset-tokens": "20s",
        }
        for _ in range(290):  # a long stream: never cut, past the budget
            await stream.add_tokens(1)
        await stream.release()

        err = await refused(lambda: policy.admit(caller, 10))
        # 300 in this window, 10 to fit: floor(300·(20−t)/10) ≤ 90 once t > 10 + 10·(1 − 91/300)
        wait = 10 + 10 * (1 - 91 / 300)
        assert (err.status, err.code) == (429, "rate_limit_exceeded")
        assert err.headers == {
            "retry-after": "17",
            "retry-after-ms": str(int(wait * 1000) + 1),
            "x-ratelimit-limit-tokens": "100",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "20s",
        }
        assert "used 300, this request needs 10" in err.message

        clock.advance(wait - 0.002)
        await refused(lambda: policy.admit(caller, 10))
        clock.advance(0.004)
        later = await policy.admit(caller, 10)
        assert later.headers["x-ratelimit-remaining-tokens"] == "0"  # 90.x used + 10
        await later.release()

    run(go())
    assert rejections(registry, "tps") == 2 and rejections(registry, "qps") == 0


def test_tokens_are_flushed_at_release_and_after_it(make_policy: PolicyFactory) -> None:
    policy, key = make_policy(TierConfig(tokens_per_second=10), tokens_window_s=10)
    policy.flush_tokens, policy.flush_interval_s = 1000, 1e9  # as with Redis: batched

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        admission = await policy.admit(caller, 1)
        await admission.add_tokens(40)
        window = policy._windows_of(caller.tier)[1]
        assert window is not None
        assert (await policy.windows.token_state(caller.key_id, window)).current == 1  # still pending
        await admission.release()
        assert (await policy.windows.token_state(caller.key_id, window)).current == 41
        await admission.release()  # idempotent: nothing twice
        await admission.add_tokens(500)  # a late token still counts
        await admission._flush()
        assert (await policy.windows.token_state(caller.key_id, window)).current == 541

    run(go())


def test_a_prompt_larger_than_the_budget_waits_for_an_empty_window(
    make_policy: PolicyFactory, clock: FakeClock
) -> None:  # noqa: F811
    policy, key = make_policy(TierConfig(tokens_per_second=10), tokens_window_s=10)

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        big = await policy.admit(caller, 500)  # empty window: admitted, 400 debt
        await big.release()
        err = await refused(lambda: policy.admit(caller, 500))
        assert err.headers["retry-after"] == "20"  # the whole window must drain
        clock.advance(20.001)
        await (await policy.admit(caller, 500)).release()

    run(go())


def test_concurrency_cap_and_idempotent_release(make_policy: PolicyFactory) -> None:
    registry = CollectorRegistry()
    policy, key = make_policy(TierConfig(max_concurrent_requests=2), registry=registry)

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        a, b = await policy.admit(caller, 1), await policy.admit(caller, 1)
        assert a.headers == {}  # no rate limit: no x-ratelimit
        err = await refused(lambda: policy.admit(caller, 1))
        assert (err.status, err.headers) == (429, {"retry-after": "1", "retry-after-ms": "1000"})
        assert "allows 2 at a time" in err.message
        await a.release()
        await a.release()  # twice: frees one slot only
        c = await policy.admit(caller, 1)
        await refused(lambda: policy.admit(caller, 1))
        await asyncio.gather(b.release(), c.release(), c.release())
        assert policy.slots.per_key == {} and policy.slots.total == 0  # type: ignore[attr-defined]

    run(go())
    assert rejections(registry, "concurrency") == 2


def test_global_cap_is_503_for_every_key(make_policy: PolicyFactory, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    policy, key = make_policy(TierConfig(), registry=registry, limits=LimitsConfig(max_concurrent_requests=1))
    other_key = KeyStore(tmp_path / "keys.json").create("other").key

    async def go() -> None:
        caller, other = await policy.authenticate(f"Bearer {key}"), await policy.authenticate(f"Bearer {other_key}")
        held = await policy.admit(caller, 1)
        err = await refused(lambda: policy.admit(other, 1))
        assert (err.status, err.code, err.headers["retry-after"]) == (503, "overloaded", "1")
        await held.release()
        await (await policy.admit(other, 1)).release()

    run(go())
    assert rejections(registry, "global", tier="other") == 1


def test_a_refused_request_costs_nothing(make_policy: PolicyFactory, clock: FakeClock) -> None:  # noqa: F811
    policy, key = make_policy(
        TierConfig(requests_per_second=1, tokens_per_second=10, max_concurrent_requests=1), tokens_window_s=10
    )

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        first = await policy.admit(caller, 90)
        await first.release()
        clock.advance(1.001)  # QPS free again; 90 of 100 tokens used
        err = await refused(lambda: policy.admit(caller, 11))  # tps: no request counted
        assert "tokens" in err.message
        ok = await policy.admit(caller, 5)
        assert ok.headers["x-ratelimit-remaining-requests"] == "0"
        assert ok.headers["x-ratelimit-remaining-tokens"] == "5"
        await ok.release()
        err = await refused(lambda: policy.admit(caller, 1))  # qps: no tokens charged
        assert "requests" in err.message and policy.slots.total == 0  # type: ignore[attr-defined]
        window = policy._windows_of(caller.tier)[1]
        assert window is not None and (await policy.windows.token_state(caller.key_id, window)).current == 95

    run(go())


def test_storage_failure_fails_closed(make_policy: PolicyFactory, caplog: pytest.LogCaptureFixture) -> None:
    policy, key = make_policy(TierConfig(tokens_per_second=10))

    async def broken(*_: object) -> None:
        raise ConnectionError("redis away")

    async def go() -> None:
        caller = await policy.authenticate(f"Bearer {key}")
        policy.windows.token_state = broken  # type: ignore[method-assign]
        err = await refused(lambda: policy.admit(caller, 1))
        assert (err.status, err.code, err.headers["retry-after"]) == (503, "rate_limiter_unavailable", "1")
        assert policy.slots.total == 0  # type: ignore[attr-defined]

    run(go())
    assert "rate-limit storage failed" in caplog.text


def test_default_registry_takes_several_policies(tmp_path: Path) -> None:
    config = GatewayConfig(keys_file=str(tmp_path / "keys.json"))
    first, second = AccessPolicy(config), AccessPolicy(config)
    assert first.rejections is second.rejections
