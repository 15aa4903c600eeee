"""The rate windows: window sizes from tier rates, the sliding token window's
arithmetic (used, fits, wait, reset), header formats, and both windows on
`limits`' memory storage under a fake clock."""

from __future__ import annotations

import asyncio

import pytest
from limits.aio.storage import MemoryStorage

from gateway.admission.limits import (
    RateWindow,
    RateWindows,
    RequestState,
    TokenState,
    format_reset,
    rate_limit_headers,
    request_window,
    retry_headers,
    token_window,
)
from tests.unit.gateway.access_fakes import FakeClock, clock  # noqa: F401  (fixture)


@pytest.mark.parametrize(
    "rps, window",
    [
        (0, None),
        (-1, None),
        (2, RateWindow(2, 1)),
        (50, RateWindow(50, 1)),
        (2.5, RateWindow(5, 2)),
        (0.5, RateWindow(1, 2)),
        (0.1, RateWindow(1, 10)),
        (1 / 3, RateWindow(1, 3)),
        (0.001, RateWindow(1, 1000)),
    ],
)
def test_request_window(rps: float, window: RateWindow | None) -> None:
    assert request_window(rps) == window


def test_token_window() -> None:
    assert token_window(0) is None
    assert token_window(200) == RateWindow(12_000, 60)
    assert token_window(0.01, 10) == RateWindow(1, 10)  # never a zero budget


def test_token_state_arithmetic() -> None:
    # 10 s window, 4 s left in it; previous window 50 tokens, this one 80; budget 100
    s = TokenState(limit=100, seconds=10, previous=50, current=80, ends_in=4.0)
    assert s.used == pytest.approx(50 * 0.4 + 80) and s.remaining == 0
    assert s.used_after(2.0) == pytest.approx(50 * 0.2 + 80)
    assert s.used_after(4.0) == pytest.approx(80) and s.used_after(9.0) == pytest.approx(40)
    assert s.used_after(14.0) == 0
    assert not s.fits(1)
    # 10 needed → floor(used) ≤ 90, i.e. used < 91: within this window
    # (50·(4−t)/10 + 80 < 91 → t > 1.8)
    assert s.wait_for(10) == pytest.approx(1.8)
    assert s.fits(10) is False and TokenState(100, 10, 50, 80, 1.79).fits(10)
    # 30 needed → used < 71 < current: after this window ends (80·(14−t)/10 < 71 → t > 5.125)
    assert s.wait_for(30) == pytest.approx(5.125)
    assert s.reset_s == pytest.approx(14.0)
    assert TokenState(100, 10, 50, 0, 4.0).reset_s == pytest.approx(4.0)
    assert TokenState(100, 10, 0, 0, 0.0).reset_s == 0 and TokenState(100, 10, 0, 0, 0.0).wait_for(100) == 0


def test_debt_wait_scales_with_the_debt() -> None:
    small = TokenState(limit=100, seconds=10, previous=0, current=150, ends_in=10.0)
    large = TokenState(limit=100, seconds=10, previous=0, current=1000, ends_in=10.0)
    # one token must fit: used < 100
    assert small.wait_for(1) == pytest.approx(10 + 10 * (1 - 100 / 150))
    assert large.wait_for(1) == pytest.approx(10 + 10 * (1 - 100 / 1000))
    assert small.wait_for(1) < large.wait_for(1) <= 20  # forgiven after 2 windows at most


def test_format_reset_and_retry_headers() -> None:
    assert [format_reset(s) for s in (0, 0.0201, 0.5, 1, 1.5, 59.9994, 60, 360, 361.2)] == [
        "0s",
        "21ms",
        "500ms",
        "1s",
        "1.5s",
        "59.999s",
        "1m0s",
        "6m0s",
        "6m2s",
    ]
    assert retry_headers(0.2) == {"retry-after": "1", "retry-after-ms": "200"}
    assert retry_headers(7.0001) == {"retry-after": "8", "retry-after-ms": "7001"}
    assert rate_limit_headers(None, None) == {}
    assert rate_limit_headers(RequestState(2, 1, 0.25), TokenState(100, 10, 0, 30, 5.0)) == {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "250ms",
        "x-ratelimit-limit-tokens": "100",
        "x-ratelimit-remaining-tokens": "70",
        "x-ratelimit-reset-tokens": "15s",
    }


def test_request_window_on_memory_storage(clock: FakeClock) -> None:  # noqa: F811
    async def run() -> None:
        windows = RateWindows(MemoryStorage(), clock=clock.time)
        w = RateWindow(2, 1)
        assert await windows.request_state("k", w) == RequestState(2, 2, 0.0)
        assert await windows.hit_request("k", w)
        clock.advance(0.4)
        assert await windows.hit_request("k", w)
        assert not await windows.hit_request("k", w)  # 2 in the last second
        assert not await windows.hit_request("k", w)  # a refusal is not counted
        state = await windows.request_state("k", w)
        assert (state.limit, state.remaining) == (2, 0) and state.reset_s == pytest.approx(0.601)
        assert await windows.hit_request("other", w)  # keys are separate
        clock.advance(0.6)
        assert not await windows.hit_request("k", w)  # exactly 1 s old: still inside
        clock.advance(0.001)  # reset_s later: the first one left
        assert await windows.hit_request("k", w)
        assert not await windows.hit_request("k", w)

    asyncio.run(run())


def test_token_window_on_memory_storage(clock: FakeClock) -> None:  # noqa: F811
    async def run() -> None:
        windows = RateWindows(MemoryStorage(), clock=clock.time)
        w = RateWindow(100, 10)
        await windows.charge_tokens("k", w, 30)
        state = await windows.token_state("k", w)
        assert (state.previous, state.current, state.ends_in) == (0, 30, pytest.approx(10.0))
        await windows.charge_tokens("k", w, 500)  # past the budget: recorded all the same
        state = await windows.token_state("k", w)
        assert state.current == 530 and state.remaining == 0
        clock.advance(12.0)  # the next window, 2 s in
        state = await windows.token_state("k", w)
        assert (state.previous, state.current) == (530, 0) and state.ends_in == pytest.approx(8.0)
        assert state.used == pytest.approx(530 * 0.8)
        wait = state.wait_for(1)
        clock.advance(wait - 0.01)
        assert not (await windows.token_state("k", w)).fits(1)
        clock.advance(0.02)
        assert (await windows.token_state("k", w)).fits(1)

    asyncio.run(run())
