"""Retry policy: full-jitter exponential backoff (tenacity), `Retry-After`
honoured, and a token-bucket retry budget shared by a client's requests."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_random_exponential

from .config import RetryConfig
from .errors import RequestError, is_retryable

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class RetryBudget:
    """At most `ratio` retries per request plus `floor` spare ones, banked up to `cap`.

    Every request deposits `ratio` tokens, every retry withdraws one. Thread-safe:
    the sync wrapper and Locust users may share one budget.
    """

    def __init__(self, ratio: float, floor: float, cap: float) -> None:
        self._ratio = ratio
        self._cap = cap
        self._balance = floor
        self._lock = threading.Lock()
        self.retries_allowed = 0
        self.retries_denied = 0

    @classmethod
    def from_config(cls, config: RetryConfig) -> RetryBudget:
        return cls(config.budget_ratio, config.budget_floor, config.budget_cap)

    @property
    def balance(self) -> float:
        return self._balance

    def record_request(self) -> None:
        with self._lock:
            self._balance = min(self._cap, self._balance + self._ratio)

    def try_spend(self) -> bool:
        with self._lock:
            if self._balance >= 1.0:
                self._balance -= 1.0
                self.retries_allowed += 1
                return True
            self.retries_denied += 1
            return False


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _WaitRetryAfterOrJitter:
    """Waits what the server asked for (bounded), else full-jitter backoff."""

    def __init__(self, config: RetryConfig) -> None:
        self._jitter = wait_random_exponential(multiplier=config.backoff_base_s, max=config.backoff_max_s)
        self._max_retry_after = config.max_retry_after_s

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RequestError) and exc.retry_after_s is not None:
            return min(exc.retry_after_s, self._max_retry_after)
        return self._jitter(state)


class _StopWhenBudgetSpent(stop_base):
    def __init__(self, budget: RetryBudget) -> None:
        self._budget = budget

    def __call__(self, state: RetryCallState) -> bool:
        if self._budget.try_spend():
            return False
        log.warning("retry budget exhausted; giving up after %d attempt(s)", state.attempt_number)
        return True


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    wait = state.next_action.sleep if state.next_action else 0.0
    log.info("retrying after attempt %d (%s) in %.3fs", state.attempt_number, type(exc).__name__, wait)


def build_retrying(config: RetryConfig, budget: RetryBudget, sleep: Sleep = asyncio.sleep) -> AsyncRetrying:
    """A tenacity controller; the attempt limit is checked before the budget is spent."""
    return AsyncRetrying(
        retry=retry_if_exception(is_retryable),
        stop=stop_after_attempt(config.max_attempts) | _StopWhenBudgetSpent(budget),
        wait=_WaitRetryAfterOrJitter(config),
        sleep=sleep,
        before_sleep=_log_retry,
        reraise=True,
    )
