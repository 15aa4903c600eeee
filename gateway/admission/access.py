"""AccessPolicy: the gateway's `Policy` (gateway/core/policy.py) over the key store
(keys.py), the tiers (config.py), the rate windows (limits.py) and the
concurrency slots (slots.py).

Admission order, so that a refused request costs its caller nothing:
  1. tokens: the prompt must fit in the key's token window (read only);
  2. concurrency: a slot for the key and one of the global cap (atomic);
  3. requests: one admission in the key's request window (atomic; on refusal
     the slots of 2 are given back);
  4. the prompt's tokens are charged.
Two concurrent requests of one key may both pass 1 and both be charged in 4:
the surplus is debt, exactly like output tokens past the budget, so it delays
the key's next request instead of failing either.

A refusal is a GatewayError: 429 (kind qps, tps or concurrency) with
Retry-After, retry-after-ms and OpenAI's x-ratelimit-* headers; the global cap
is the service's limit, not the caller's, so it is 503 with Retry-After. When
the rate-limit storage (Redis) is unreachable, admission fails closed with 503:
every request costs accelerator time, and an unmetered fleet is the worse
failure. A running stream is never cut: add_tokens and release only log.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from ..config import GatewayConfig, TierConfig
from ..core.errors import GatewayError
from ..core.policy import Caller
from .keys import KeyStore, key_id_of, resolve_keys_file
from .limits import (
    DEFAULT_TOKENS_WINDOW_S,
    RateWindow,
    RateWindows,
    RequestState,
    TokenState,
    rate_limit_headers,
    request_window,
    retry_headers,
    storage_for,
    token_window,
)
from .slots import MemorySlots, RedisSlots, Slot, Slots

log = logging.getLogger(__name__)

_WRONG_KEY = "Incorrect API key provided. You can find your API key in your gateway's key list."
_MISSING_KEY = "You didn't provide an API key. Send it as an 'Authorization: Bearer sk-...' header."
_AUTH_HEADERS = {"WWW-Authenticate": "Bearer"}

# one Counter per registry: several policies in one process (tests, a reload)
# must not register the same name twice
_rejections: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _rejection_counter(registry: CollectorRegistry) -> Counter:
    if registry not in _rejections:
        _rejections[registry] = Counter(
            "gateway_rate_limited_total",
            "Requests refused by a rate or concurrency limit, by tier and kind (qps, tps, concurrency, global)",
            ["tier", "kind"],
            registry=registry,
        )
    return _rejections[registry]


class LimitedAdmission:
    """One admitted request's hold (policy.Admission)."""

    def __init__(
        self, policy: AccessPolicy, caller: Caller, slot: Slot, tokens: RateWindow | None, headers: dict[str, str]
    ) -> None:
        self.headers = headers
        self.caller = caller
        self._policy = policy
        self._slot = slot
        self._tokens = tokens
        self._pending = 0  # tokens not yet written to the window
        self._last_flush = time.monotonic()
        self._released = False

    async def add_tokens(self, count: int) -> None:
        if self._tokens is None or count <= 0:
            return
        self._pending += count
        # with Redis, one round trip per streamed token would tax every stream:
        # tokens are written in batches, at the latest every flush_interval_s
        # and always at release, before the next request of a finished stream
        if (
            self._pending >= self._policy.flush_tokens
            or time.monotonic() - self._last_flush >= self._policy.flush_interval_s
        ):
            await self._flush()

    async def _flush(self) -> None:
        amount, self._pending = self._pending, 0
        self._last_flush = time.monotonic()
        if self._tokens is None or amount <= 0:
            return
        try:
            await self._policy.windows.charge_tokens(self.caller.key_id, self._tokens, amount)
        except Exception:
            log.warning("recording %d tokens of key %s failed", amount, self.caller.key_id, exc_info=True)

    async def release(self) -> None:
        if self._released:
            return
        self._released = True  # first, so a concurrent second call returns at once
        await self._flush()
        try:
            await self._policy.slots.release(self._slot)
        except Exception:  # the slot's TTL frees it in Redis
            log.warning("releasing a slot of key %s failed", self.caller.key_id, exc_info=True)


class AccessPolicy:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        registry: CollectorRegistry | None = None,
        store: KeyStore | None = None,
        tokens_window_s: int = DEFAULT_TOKENS_WINDOW_S,
        redis_prefix: str = "gateway",
        slot_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store or KeyStore(resolve_keys_file(config.keys_file))
        self.tokens_window_s = tokens_window_s
        self._redis_pool: Any = None
        self.slots: Slots = MemorySlots()
        if config.redis_url:
            import redis.asyncio as aioredis  # late: the memory path never needs it

            # one pool for the windows and the slots; connections open on first use
            self._redis_pool = aioredis.ConnectionPool.from_url(config.redis_url)
            self.slots = RedisSlots(
                aioredis.Redis(connection_pool=self._redis_pool), prefix=redis_prefix, ttl_s=slot_ttl_s
            )
        self.windows = RateWindows(
            storage_for(config.redis_url, key_prefix=redis_prefix, connection_pool=self._redis_pool), clock=clock
        )
        # memory: every token at once (cheap, exact); Redis: batches
        self.flush_tokens = 32 if config.redis_url else 1
        self.flush_interval_s = 0.25
        self.rejections = _rejection_counter(registry if registry is not None else REGISTRY)

    async def aclose(self) -> None:
        """At shutdown: stop renewing slots, close the Redis connections."""
        await self.slots.aclose()
        if self._redis_pool is not None:
            await self._redis_pool.aclose()

    # who

    async def authenticate(self, authorization: str | None) -> Caller:
        if not authorization or not authorization.strip():
            raise GatewayError(401, _MISSING_KEY, code="missing_api_key", headers=dict(_AUTH_HEADERS))
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        record = self.store.verify(key) if scheme.lower() == "bearer" else None
        if record is None or record.revoked:
            # the id only when the key is well-formed: never a key, never raw input
            log.info("authentication refused (key id %s)", key_id_of(key) or "-")
            raise GatewayError(401, _WRONG_KEY, code="invalid_api_key", headers=dict(_AUTH_HEADERS))
        tier = self.config.tiers.get(record.tier)
        if tier is None:
            log.error("key %s has tier %r, which the settings do not define", record.key_id, record.tier)
            raise GatewayError(401, _WRONG_KEY, code="invalid_api_key", headers=dict(_AUTH_HEADERS))
        return Caller(key_id=record.key_id, tier_name=record.tier, tier=tier)

    def check_model(self, caller: Caller, model: str) -> None:
        allowed = caller.tier.allowed_models
        if allowed and model not in allowed:
            raise GatewayError(
                403,
                f"Your API key's tier '{caller.tier_name}' may not use model '{model}'.",
                param="model",
                code="model_not_allowed",
            )

    # admission

    def _windows_of(self, tier: TierConfig) -> tuple[RateWindow | None, RateWindow | None]:
        return request_window(tier.requests_per_second), token_window(tier.tokens_per_second, self.tokens_window_s)

    async def admit(self, caller: Caller, prompt_tokens: int) -> LimitedAdmission:
        try:
            return await self._admit(caller, max(0, prompt_tokens))
        except GatewayError:
            raise
        except Exception:
            log.exception("rate-limit storage failed; refusing key %s's request", caller.key_id)
            raise GatewayError(
                503,
                "The gateway cannot check rate limits right now; retry shortly.",
                code="rate_limiter_unavailable",
                headers=retry_headers(1.0),
            ) from None

    async def _admit(self, caller: Caller, prompt_tokens: int) -> LimitedAdmission:
        key_id, tier = caller.key_id, caller.tier
        requests, tokens = self._windows_of(tier)

        token_state: TokenState | None = None
        if tokens is not None:
            token_state = await self.windows.token_state(key_id, tokens)
            # at least 1, so a key in debt waits even with an uncounted prompt
            need = max(1, min(prompt_tokens, tokens.amount))
            if not token_state.fits(need):
                request_state = await self.windows.request_state(key_id, requests) if requests else None
                raise self._refuse(
                    caller,
                    "tps",
                    token_state.wait_for(need),
                    request_state,
                    token_state,
                    f"Rate limit reached for tokens: {tokens.amount} per {tokens.seconds} s "
                    f"(used {math.floor(token_state.used)}, this request needs {need}).",
                )

        slot = await self.slots.acquire(
            key_id, tier.max_concurrent_requests, self.config.limits.max_concurrent_requests
        )
        if not isinstance(slot, Slot):
            if slot == "global":
                raise self._refuse(
                    caller,
                    "global",
                    1.0,
                    None,
                    None,
                    "The gateway is at its concurrent-request capacity; retry shortly.",
                )
            raise self._refuse(
                caller,
                "concurrency",
                1.0,
                None,
                None,
                f"Too many concurrent requests: this key's tier allows {tier.max_concurrent_requests} at a time.",
            )

        try:
            request_state = None
            if requests is not None:
                if not await self.windows.hit_request(key_id, requests):
                    state = await self.windows.request_state(key_id, requests)
                    raise self._refuse(
                        caller,
                        "qps",
                        state.reset_s,
                        state,
                        token_state,
                        f"Rate limit reached for requests: {requests.amount} per {requests.seconds} s.",
                    )
            if tokens is not None and token_state is not None:
                token_state = TokenState(
                    limit=token_state.limit,
                    seconds=token_state.seconds,
                    previous=token_state.previous,
                    current=token_state.current + prompt_tokens,
                    ends_in=token_state.ends_in,
                )
            # the prompt's charge and the headers' read are independent: one
            # round trip of waiting instead of two when Redis holds them
            jobs: list[Awaitable[Any]] = []
            if tokens is not None:
                jobs.append(self.windows.charge_tokens(key_id, tokens, prompt_tokens))
            if requests is not None:
                jobs.append(self.windows.request_state(key_id, requests))
            done = await asyncio.gather(*jobs)
            request_state = done[-1] if requests is not None else None
        except BaseException:
            await self.slots.release(slot)
            raise
        return LimitedAdmission(self, caller, slot, tokens, rate_limit_headers(request_state, token_state))

    def _refuse(
        self,
        caller: Caller,
        kind: str,
        wait_s: float,
        requests: RequestState | None,
        tokens: TokenState | None,
        message: str,
    ) -> GatewayError:
        self.rejections.labels(tier=caller.tier_name, kind=kind).inc()
        log.info("rate limited: key %s tier %s kind %s retry in %.3f s", caller.key_id, caller.tier_name, kind, wait_s)
        headers = {**retry_headers(wait_s), **rate_limit_headers(requests, tokens)}
        if kind == "global":
            return GatewayError(503, message, code="overloaded", headers=headers)
        return GatewayError(429, message, code="rate_limit_exceeded", headers=headers)
