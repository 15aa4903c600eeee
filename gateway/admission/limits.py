"""Per-key request and token rate windows, on the `limits` library.

RateWindow semantics (chosen for what each counts):

* Requests (QPS): a **moving window** (`limits`' MovingWindowRateLimiter):
  at most N admissions in ANY trailing window of W seconds, exactly. N/W is
  `requests_per_second` (W = 1 s when it is a whole number; 0.5 → 1 per 2 s).
  A request is counted when admitted; refused requests are not counted. A
  refused request may retry when the oldest admission leaves the window
  (`Retry-After`, `x-ratelimit-reset-requests`). Cheap because N is small.
* Tokens (TPS): a **sliding window counter** (`limits`' sliding-window-counter
  storage): the count of this window plus the previous window's count weighted
  by how much of it still overlaps, over W = `tokens_window_s` (default 60 s,
  so the budget is tokens_per_second × 60, like OpenAI's tokens per minute).
  O(1) per update whatever the token count, which a per-token log is not.
  - Admission needs the prompt to fit: used + min(prompt, budget) ≤ budget
    (a prompt larger than the whole budget needs the whole budget free, so it
    is admitted eventually instead of never).
  - Output tokens are recorded as they stream and NEVER refused (`charge`,
    which records past the budget): the surplus is the key's debt, and its
    next request waits until the weighted count has decayed below the budget.
  - Why 60 s and not 1 s: a window forgets everything older than 2 W, so a
    stream's debt is forgiven after at most 2 W. With a 1 s window a key could
    overshoot by a whole long stream every 2 s; with 60 s the long-run rate
    stays close to the limit. The cost: bursts up to one window's budget.

Storage: in process memory by default; with a Redis URL, `limits`' Redis
storage (Lua scripts, atomic), so every gateway process counts against the same
windows. The token windows run on Redis' TTLs (server clock); the request log
on the gateways' clocks (hosts keep NTP time).

0 in a limit means unlimited: no window, no header for it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

# passed as the limit to record tokens past the budget: the storage's own
# check (count + amount > limit) can then never refuse
_UNBOUNDED = 2**52
DEFAULT_TOKENS_WINDOW_S = 60


@dataclass(frozen=True)
class RateWindow:
    amount: int  # the budget
    seconds: int  # over this many seconds


def request_window(requests_per_second: float) -> RateWindow | None:
    """The smallest whole-second window holding a whole number of requests
    (2.5/s → 5 per 2 s); None when unlimited."""
    if requests_per_second <= 0:
        return None
    for seconds in range(1, 61):
        amount = requests_per_second * seconds
        if amount >= 1 and abs(amount - round(amount)) < 1e-6:
            return RateWindow(round(amount), seconds)
    if requests_per_second >= 1:
        return RateWindow(math.floor(requests_per_second), 1)
    return RateWindow(1, math.ceil(1 / requests_per_second))


def token_window(tokens_per_second: float, seconds: int = DEFAULT_TOKENS_WINDOW_S) -> RateWindow | None:
    if tokens_per_second <= 0:
        return None
    return RateWindow(max(1, round(tokens_per_second * seconds)), seconds)


@dataclass(frozen=True)
class RequestState:
    limit: int
    remaining: int
    reset_s: float  # until the oldest admission leaves the window (one more may enter)


@dataclass(frozen=True)
class TokenState:
    """A sliding window counter as read: the previous window's count, this
    window's, and `ends_in`, the seconds until this window becomes the previous."""

    limit: int
    seconds: int
    previous: int
    current: int
    ends_in: float

    def used_after(self, t: float) -> float:
        """The weighted count t seconds from now, with nothing more added."""
        w = self.seconds
        if t < self.ends_in:
            return self.previous * (self.ends_in - t) / w + self.current
        if t < self.ends_in + w:
            return self.current * (self.ends_in + w - t) / w
        return 0.0

    @property
    def used(self) -> float:
        return self.used_after(0.0)

    @property
    def remaining(self) -> int:
        # the library floors the weighted count: 12.7 used of 100 leaves 88
        return max(0, self.limit - math.floor(self.used))

    def fits(self, need: int) -> bool:
        return math.floor(self.used) + need <= self.limit

    def wait_for(self, need: int) -> float:
        """Seconds until `need` tokens fit (0 when they do now). The weighted
        count decays linearly, so each phase solves for t directly; past the
        returned time, floor(used) + need ≤ limit holds."""
        if self.fits(need):
            return 0.0
        target = self.limit - need + 1  # fits once used_after(t) < target
        w = self.seconds
        if self.current < target and self.previous > 0:
            # the previous window's weight runs out first, within ends_in
            return max(0.0, self.ends_in - (target - self.current) * w / self.previous)
        # this window must become the previous one and decay in turn
        return self.ends_in + w * (1 - target / self.current) if self.current else self.ends_in

    @property
    def reset_s(self) -> float:
        """Until the window is empty again (OpenAI's reset: back to full)."""
        if self.current:
            return self.ends_in + self.seconds
        return self.ends_in if self.previous else 0.0


def storage_for(redis_url: str, *, key_prefix: str = "gateway", connection_pool: Any = None) -> Storage:
    """Memory by default; `limits`' Redis storage (via redis-py) for a URL,
    on the caller's connection pool when given (one pool per process, closed
    by its owner)."""
    if not redis_url:
        return MemoryStorage()
    uri = redis_url if redis_url.startswith("async+") else f"async+{redis_url}"
    options: dict[str, Any] = {"connection_pool": connection_pool} if connection_pool is not None else {}
    return RedisStorage(uri, implementation="redispy", key_prefix=f"{key_prefix}:limits", **options)


class RateWindows:
    """The request and token windows of every key, in one storage."""

    def __init__(self, storage: Storage, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.requests = MovingWindowRateLimiter(storage)
        # only for the moving window's absolute reset time; the storages keep
        # their own time (the memory one reads time.time, Redis its TTLs)
        self.clock = clock

    @staticmethod
    def _request_item(window: RateWindow) -> RateLimitItemPerSecond:
        return RateLimitItemPerSecond(window.amount, window.seconds)

    @staticmethod
    def _token_key(key_id: str, window: RateWindow) -> str:
        # the window length is part of the key: a changed length starts fresh
        # instead of misreading the old counters
        return f"tokens/{key_id}/{window.seconds}"

    async def hit_request(self, key_id: str, window: RateWindow) -> bool:
        """Count one admission; False (and nothing counted) when the window is full."""
        return await self.requests.hit(self._request_item(window), "requests", key_id)

    async def request_state(self, key_id: str, window: RateWindow) -> RequestState:
        stats = await self.requests.get_window_stats(self._request_item(window), "requests", key_id)
        remaining = max(0, stats.remaining)
        # + 1 ms: an admission still counts at exactly W old (the library's
        # test is inclusive), so a client retrying on the dot would be refused
        reset = max(0.0, stats.reset_time - self.clock()) + 0.001 if remaining < window.amount else 0.0
        return RequestState(limit=window.amount, remaining=remaining, reset_s=reset)

    async def token_state(self, key_id: str, window: RateWindow) -> TokenState:
        # type-ignored below: the limits storage has these methods; its base class does not declare them
        previous, previous_ttl, current, current_ttl = await self.storage.get_sliding_window(  # type: ignore[attr-defined]
            self._token_key(key_id, window), window.seconds
        )
        # both storages report this window's TTL as (time left in it) + W,
        # and the previous one's as the time left in this one
        ends_in = current_ttl - window.seconds if current_ttl > 0 else previous_ttl
        ends_in = min(max(0.0, ends_in), float(window.seconds))
        return TokenState(
            limit=window.amount, seconds=window.seconds, previous=int(previous), current=int(current), ends_in=ends_in
        )

    async def charge_tokens(self, key_id: str, window: RateWindow, amount: int) -> None:
        """Record tokens, past the budget too (the surplus is debt)."""
        if amount > 0:
            # type-ignored below: as above (a sliding-window method undeclared on the base class)
            await self.storage.acquire_sliding_window_entry(  # type: ignore[attr-defined]
                self._token_key(key_id, window), _UNBOUNDED, window.seconds, amount
            )


def format_reset(seconds: float) -> str:
    """OpenAI's x-ratelimit-reset-* form: '20ms', '1.5s', '6m0s'."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def rate_limit_headers(requests: RequestState | None, tokens: TokenState | None) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for whichever limits apply."""
    headers: dict[str, str] = {}
    if requests is not None:
        headers["x-ratelimit-limit-requests"] = str(requests.limit)
        headers["x-ratelimit-remaining-requests"] = str(requests.remaining)
        headers["x-ratelimit-reset-requests"] = format_reset(requests.reset_s)
    if tokens is not None:
        headers["x-ratelimit-limit-tokens"] = str(tokens.limit)
        headers["x-ratelimit-remaining-tokens"] = str(tokens.remaining)
        headers["x-ratelimit-reset-tokens"] = format_reset(tokens.reset_s)
    return headers


def retry_headers(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds (HTTP's form, at least 1) and OpenAI's
    retry-after-ms, which the OpenAI SDKs prefer."""
    seconds = max(seconds, 0.001)
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(math.ceil(seconds * 1000))}
