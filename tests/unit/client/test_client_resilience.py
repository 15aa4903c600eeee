"""Retries (only before the first token), the retry budget, Retry-After,
LLM timeouts, and cancellation sending `stop` for the ensemble."""

from __future__ import annotations

import asyncio
import json

import pytest

from client import (
    FirstTokenTimeoutError,
    RequestError,
    RetryBudget,
    RetryConfig,
    ServerConnectionError,
    TimeoutConfig,
    TokenTimeoutError,
)
from client.retry import parse_retry_after
from tests.unit.client.sse_fakes import Step, delta

pytestmark = pytest.mark.anyio
OVERLOADED = "in ensemble 'ensemble', overloaded: waiting queue is full (64)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_overloaded_is_retried_with_full_jitter_backoff(fake, make_client, sleeps):
    fake.add_error(400, OVERLOADED)
    fake.add_error(400, OVERLOADED, as_sse=True)
    fake.add_connect_error()
    fake.add_stream(Step(delta("fine", finish_reason="stop")))
    retry = RetryConfig(max_attempts=5, backoff_base_s=0.1, backoff_max_s=1.0)
    async with make_client(retry=retry) as client:
        result = await client.generate("x")
    assert result.text == "fine" and result.attempts == 4
    ids = {json.loads(r.content)["id"] for r in fake.stream_requests}
    assert ids == {result.request_id}  # one logical request: same id on every attempt
    assert len(sleeps.calls) == 3
    # full jitter: uniform in [0, min(max, base * 2**n)]
    for attempt, slept in enumerate(sleeps.calls, start=1):
        assert 0 <= slept <= min(1.0, 0.1 * 2 ** (attempt - 1))


async def test_gives_up_after_max_attempts_with_the_server_message(fake, make_client, sleeps):
    for _ in range(3):
        fake.add_error(400, OVERLOADED)
    async with make_client(retry=RetryConfig(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.1)) as client:
        with pytest.raises(RequestError, match="overloaded:"):
            await client.generate("x")
    assert len(fake.stream_requests) == 3 and len(sleeps.calls) == 2


async def test_connection_errors_are_retried_then_surface(fake, make_client):
    fake.add_connect_error()
    fake.add_connect_error()
    async with make_client(retry=RetryConfig(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.1)) as client:
        with pytest.raises(ServerConnectionError, match=r"^cannot reach .*: ConnectError\('connection refused'\)$"):
            await client.generate("x")
    assert len(fake.stream_requests) == 2
    assert not fake.stops


async def test_retry_budget_is_shared_and_stops_a_retry_storm(fake, make_client):
    budget = RetryBudget(ratio=0.0, floor=1.0, cap=1.0)  # exactly one retry for the whole client
    for _ in range(4):
        fake.add_error(503, "busy")
    retry = RetryConfig(max_attempts=10, backoff_base_s=0.01, backoff_max_s=0.1)
    async with make_client(retry=retry, budget=budget) as client:
        for _ in range(2):
            with pytest.raises(RequestError, match=r"^HTTP 503: busy$"):
                await client.generate("x")
    # request 1: attempt + the one budgeted retry; request 2: a single attempt
    assert len(fake.stream_requests) == 3
    assert budget.retries_allowed == 1 and budget.retries_denied == 2


def test_budget_deposits_a_share_per_request_and_is_capped():
    budget = RetryBudget(ratio=0.2, floor=0.0, cap=1.0)
    assert not budget.try_spend()
    for _ in range(5):
        budget.record_request()
    assert budget.try_spend() and not budget.try_spend()
    for _ in range(50):
        budget.record_request()
    assert budget.balance == pytest.approx(1.0)  # banked retries never exceed the cap


async def test_retry_after_header_is_honoured(fake, make_client, sleeps):
    fake.add_error(429, "slow down", headers={"Retry-After": "2"})
    fake.add_stream(Step(delta("ok", finish_reason="stop")))
    async with make_client() as client:
        result = await client.generate("x")
    assert result.attempts == 2
    assert sleeps.calls == [2.0]


def test_parse_retry_after_accepts_seconds_and_http_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == pytest.approx(10.0)
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


async def test_no_retry_once_the_first_token_arrived(fake, make_client):
    fake.add_stream(Step(delta("tok")), Step({"error": OVERLOADED}))
    async with make_client() as client:
        result = await client.generate("x")
    assert len(fake.stream_requests) == 1
    assert result.finish_reason == "error" and "overloaded:" in result.error


async def test_per_token_timeout_raises_and_closes_the_stream(fake, make_client):
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=5.0))
    async with make_client(timeouts=TimeoutConfig(token_s=0.1)) as client:
        stream = client.stream("x")
        with pytest.raises(
            TokenTimeoutError, match=r"^no response for 0\.1s after 1 response\(s\) \(per-token timeout\)$"
        ) as info:
            async for _ in stream:
                pass
    assert info.value.result is stream.result
    assert stream.result.text == "a" and stream.result.finish_reason == "timeout"
    assert fake.closed_streams == 1  # the HTTP response was closed, not left hanging
    assert [s["id"] for s in fake.stops] == [stream.request_id]


async def test_first_token_timeout(fake, make_client):
    fake.add_stream(Step(delta("late"), delay_s=5.0))
    async with make_client(timeouts=TimeoutConfig(first_token_s=0.1)) as client:
        with pytest.raises(FirstTokenTimeoutError, match=r"^no response within 0\.1s \(first-token timeout\)$"):
            await client.generate("x")
    assert len(fake.stream_requests) == 1  # a slow server is not retried into more load


async def test_long_answers_are_not_cut_by_a_global_timeout(fake, make_client):
    # 8 gaps of 0.06 s: longer in total than every limit, each gap within the per-token one.
    fake.add_stream(*[Step(delta("t"), delay_s=0.06) for _ in range(8)], Step(delta("", finish_reason="length")))
    async with make_client(timeouts=TimeoutConfig(token_s=0.3, first_token_s=0.3)) as client:
        result = await client.generate("x")
    assert result.text == "t" * 8 and result.finish_reason == "length"


async def test_cancelling_the_task_sends_stop_for_the_ensemble(fake, make_client):
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
    async with make_client(model="ensemble") as client:
        stream = client.stream("x", request_id="cancel-me")
        got_first = asyncio.Event()

        async def consume() -> None:
            async for _ in stream:
                got_first.set()

        task = asyncio.create_task(consume())
        await got_first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert stream.result.finish_reason == "cancelled"
    assert fake.closed_streams == 1
    assert len(fake.stops) == 1
    stop = fake.stops[0]
    assert stop["id"] == "cancel-me" and stop["stop"] is True
    assert stop["input_ids"] == [0] and stop["input_lengths"] == [1] and stop["request_output_len"] == [1]
    assert fake.requests[-1].url.path == "/v2/models/python_llm/generate"


async def test_aclose_early_stops_ensemble_but_not_llm_bls(fake, make_client):
    for model, expected_stops in (("ensemble", 1), ("llm_bls", 0)):
        fake.stops.clear()
        fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
        async with make_client(model=model) as client:
            async with client.stream("x") as stream:
                async for _ in stream:
                    break
        assert stream.result.finish_reason == "cancelled"
        assert len(fake.stops) == expected_stops, model


async def test_unknown_request_id_on_stop_is_ignored(fake, make_client):
    fake.stop_status = 400
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
    async with make_client() as client:
        async with client.stream("x") as stream:
            async for _ in stream:
                break
    assert len(fake.stops) == 1 and stream.result.finish_reason == "cancelled"


async def test_leaving_after_the_finish_reason_sends_no_stop(fake, make_client):
    fake.add_stream(Step(delta("done", finish_reason="stop")), Step(delta(""), delay_s=10.0))
    async with make_client() as client:
        async with client.stream("x") as stream:
            async for event in stream:
                if event.finish_reason:
                    break
    assert stream.result.finish_reason == "stop"
    assert not fake.stops
