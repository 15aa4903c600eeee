"""Concurrency slots: per key (tier.max_concurrent_requests) and for all keys
together (GatewayConfig.max_concurrent_requests).

In memory, two counters (one event loop: no await between check and take, so
no lock). In Redis, two sorted sets of slot ids scored by their expiry time
(Redis' own clock): one Lua script drops expired slots, checks both caps and
takes both slots atomically, so processes never overshoot each other. A slot
lives `ttl_s` unless renewed; each process renews its live slots every
ttl_s / 3 from one background task, so a crashed gateway's slots expire within
ttl_s instead of blocking the key (or the fleet) forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

Refusal = Literal["concurrency", "global"]


@dataclass(frozen=True)
class Slot:
    key_id: str
    slot_id: str


class Slots(Protocol):
    async def acquire(self, key_id: str, key_limit: int, global_limit: int) -> Slot | Refusal: ...

    async def release(self, slot: Slot) -> None: ...

    async def aclose(self) -> None: ...


class MemorySlots:
    def __init__(self) -> None:
        self.per_key: dict[str, int] = {}
        self.total = 0

    async def acquire(self, key_id: str, key_limit: int, global_limit: int) -> Slot | Refusal:
        held = self.per_key.get(key_id, 0)
        if key_limit > 0 and held >= key_limit:
            return "concurrency"
        if global_limit > 0 and self.total >= global_limit:
            return "global"
        self.per_key[key_id] = held + 1
        self.total += 1
        return Slot(key_id, uuid.uuid4().hex)

    async def release(self, slot: Slot) -> None:
        held = self.per_key.get(slot.key_id, 0)
        if held <= 1:
            self.per_key.pop(slot.key_id, None)
        else:
            self.per_key[slot.key_id] = held - 1
        self.total = max(0, self.total - 1)

    async def aclose(self) -> None:
        return None


# KEYS: the key's set, the global set. ARGV: slot id, ttl ms, key cap, global cap (0: none).
# Returns 0 taken, 1 key cap, 2 global cap. TIME: one clock for every process.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local key_cap = tonumber(ARGV[3])
local global_cap = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if key_cap > 0 and redis.call('ZCARD', KEYS[1]) >= key_cap then return 1 end
if global_cap > 0 and redis.call('ZCARD', KEYS[2]) >= global_cap then return 2 end
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 0
"""

# KEYS: pairs (key set, global set) per slot; ARGV: ttl ms, then the slot ids.
# XX: a slot that already expired (and may have been given away) is not revived.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do
  for j = 0, 1 do
    local key = KEYS[(i - 2) * 2 + 1 + j]
    if redis.call('ZADD', key, 'XX', 'CH', now + ttl, ARGV[i]) == 1 then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end
return 0
"""


class RedisSlots:
    def __init__(self, client: Any, *, prefix: str = "gateway", ttl_s: float = 30.0) -> None:
        self.client = client  # a redis.asyncio.Redis; its owner closes it
        self.prefix = prefix
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self._acquire = self.client.register_script(_ACQUIRE)
        self._renew = self.client.register_script(_RENEW)
        self._live: dict[str, Slot] = {}
        self._renewer: asyncio.Task[None] | None = None

    def _key_set(self, key_id: str) -> str:
        return f"{self.prefix}:slots:key:{key_id}"

    @property
    def _global_set(self) -> str:
        return f"{self.prefix}:slots:global"

    async def acquire(self, key_id: str, key_limit: int, global_limit: int) -> Slot | Refusal:
        slot = Slot(key_id, uuid.uuid4().hex)
        status = int(
            await self._acquire(
                keys=[self._key_set(key_id), self._global_set],
                args=[slot.slot_id, self.ttl_ms, key_limit, global_limit],
            )
        )
        if status == 1:
            return "concurrency"
        if status == 2:
            return "global"
        self._live[slot.slot_id] = slot
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_forever(), name="gateway-slot-renewer")
        return slot

    async def release(self, slot: Slot) -> None:
        self._live.pop(slot.slot_id, None)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zrem(self._key_set(slot.key_id), slot.slot_id)
            pipe.zrem(self._global_set, slot.slot_id)
            await pipe.execute()

    async def renew(self) -> None:
        """Push every live slot's expiry ttl_s ahead (one round trip)."""
        slots = list(self._live.values())
        if not slots:
            return
        keys = [k for s in slots for k in (self._key_set(s.key_id), self._global_set)]
        await self._renew(keys=keys, args=[self.ttl_ms, *[s.slot_id for s in slots]])

    async def _renew_forever(self) -> None:
        while self._live:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                await self.renew()
            except Exception:  # Redis away for a moment: the next round retries
                log.warning("renewing %d concurrency slots in Redis failed", len(self._live), exc_info=True)

    async def aclose(self) -> None:
        """Stop renewing: slots still held then expire within ttl_s."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
