"""The request key (interface.md, "Request identity"): minted once per request,
sent on every attempt, carried by the stop, validated locally, never logged
at INFO or above (SSE transport against the scripted fake Triton)."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest

from client import GenerationOptions, RetryConfig
from client.types import StreamEvent
from contract.request_key import mint_request_key
from tests.unit.client.sse_fakes import Step, delta

pytestmark = pytest.mark.anyio
KEY_FORMAT = re.compile(r"[A-Za-z0-9_-]{32,128}")
OVERLOADED = "in ensemble 'ensemble', overloaded: waiting queue is full (64)"
ALREADY_FINISHED = "stop: no live request has this request_key (unknown request or already finished)"
CALLER_KEY = "caller-supplied_key-0123456789abcdef"  # 36 characters of the key alphabet


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def body_of(request) -> dict:
    return json.loads(request.content)


async def cancel_after_first(client, **fields):
    async with client.stream("x", **fields) as stream:
        async for _ in stream:
            break
    return stream


def test_minted_keys_are_well_formed_and_distinct():
    keys = {mint_request_key() for _ in range(1000)}
    assert len(keys) == 1000
    assert all(KEY_FORMAT.fullmatch(key) and len(key) == 32 for key in keys)  # 24 random bytes, base64url


async def test_every_request_sends_its_own_key(fake, make_client):
    fake.add_stream(Step(delta("a", finish_reason="stop")))
    fake.add_stream(Step(delta("b", finish_reason="stop")))
    async with make_client() as client:
        first = await client.generate("x")
        second = await client.generate("x")
    sent = [body_of(r)["request_key"] for r in fake.stream_requests]
    assert sent == [first.request_key, second.request_key]
    assert first.request_key != second.request_key
    assert all(KEY_FORMAT.fullmatch(key) for key in sent)
    assert all(body_of(r)["id"] not in sent for r in fake.stream_requests)  # the id is not the key


async def test_the_key_is_reused_across_retries(fake, make_client):
    fake.add_error(400, OVERLOADED)
    fake.add_connect_error()
    fake.add_error(503, "busy", as_sse=True)
    fake.add_stream(Step(delta("fine", finish_reason="stop")))
    async with make_client(retry=RetryConfig(max_attempts=5, backoff_base_s=0.01, backoff_max_s=0.1)) as client:
        result = await client.generate("x")
    assert result.attempts == 4 and len(fake.stream_requests) == 4
    assert {body_of(r)["request_key"] for r in fake.stream_requests} == {result.request_key}
    assert {body_of(r)["id"] for r in fake.stream_requests} == {result.request_id}


async def test_the_stop_on_cancel_carries_the_key_and_names_the_id(fake, make_client):
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
    async with make_client() as client:
        stream = await cancel_after_first(client)
    sent_key = body_of(fake.stream_requests[0])["request_key"]
    assert stream.request_key == stream.result.request_key == sent_key
    assert fake.stops == [
        {
            "input_ids": [0],
            "input_lengths": [1],
            "request_output_len": [1],
            "stop": True,
            "request_key": sent_key,
            "id": stream.request_id,
        }
    ]
    assert fake.requests[-1].url.path == "/v2/models/python_llm/generate"


async def test_a_caller_supplied_key_is_sent_and_stops_the_request(fake, make_client):
    fake.add_stream(Step(delta("a", finish_reason="stop")))
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
    async with make_client() as client:
        result = await client.generate("x", GenerationOptions(request_key=CALLER_KEY))
        other_key = "K" * 128  # the longest key the contract allows
        stream = await cancel_after_first(client, request_key=other_key)  # the stream API's keyword
    assert result.request_key == CALLER_KEY == body_of(fake.stream_requests[0])["request_key"]
    assert body_of(fake.stream_requests[1])["request_key"] == other_key == stream.request_key
    assert [s["request_key"] for s in fake.stops] == [other_key]


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "short-key",
        "a" * 31,
        "a" * 129,
        "a" * 31 + "!",
        "a" * 31 + " ",
        "a" * 31 + "=",
        "é" * 32,
        "a" * 31 + "\n",
        12345678901234567890123456789012,
        b"a" * 32,
    ],
)
async def test_a_malformed_key_is_refused_locally_without_echoing_it(fake, make_client, bad):
    with pytest.raises(ValueError, match="request_key") as info:
        GenerationOptions(request_key=bad)
    if isinstance(bad, str) and bad:
        assert bad not in str(info.value)  # a key is a secret, even a malformed one
    async with make_client() as client:
        with pytest.raises(ValueError, match="request_key"):
            client.stream("x", request_key=bad)
    assert not fake.requests


def test_keys_of_the_allowed_lengths_and_alphabet_pass():
    for key in ("a" * 32, "Z9_-" * 32, CALLER_KEY):
        assert GenerationOptions(request_key=key).request_key == key


async def test_the_echoed_key_is_on_the_events(fake, make_client):
    key = mint_request_key()
    fake.add_stream(Step(delta("a", request_key=key)), Step(delta("b", finish_reason="stop", request_key=key)))
    async with make_client() as client:
        stream = client.stream("x", request_key=key)
        events = [event async for event in stream]
    assert [event.request_key for event in events] == [key, key]
    assert stream.result.request_key == key


async def test_a_differently_echoed_key_is_the_one_the_stop_uses(fake, make_client, caplog):
    caplog.set_level(logging.DEBUG, logger="client")
    server_key = mint_request_key()
    fake.add_stream(Step(delta("a", request_key=server_key)), Step(delta("b"), delay_s=10.0))
    async with make_client() as client:
        _stream = await cancel_after_first(client, request_key=CALLER_KEY)
    assert [s["request_key"] for s in fake.stops] == [server_key]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("echoed" in message for message in warnings)
    assert not any(server_key in message or CALLER_KEY in message for message in warnings)


async def test_an_already_finished_answer_to_the_stop_is_debug_only(fake, make_client, caplog):
    caplog.set_level(logging.DEBUG, logger="client")
    fake.stop_status, fake.stop_error = 400, ALREADY_FINISHED
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
    async with make_client() as client:
        stream = await cancel_after_first(client)
    assert len(fake.stops) == 1 and stream.result.finish_reason == "cancelled"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("already finished" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


async def test_a_refused_stop_is_a_warning_that_never_shows_the_key(fake, make_client, caplog):
    caplog.set_level(logging.DEBUG, logger="client")
    async with make_client() as client:
        key = mint_request_key()
        # A server quoting the key back in its error must not leak it into logs.
        fake.stop_status, fake.stop_error = 400, f"request_key: {key} is not the key of a live request"
        fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
        await cancel_after_first(client, request_key=key)
        fake.add_stream(Step(delta("partial")), Step({"error": f"engine failed for {key}"}))
        result = await client.generate("x", request_key=key)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("request_key: <request_key>" in message for message in warnings)
    assert result.finish_reason == "error" and result.error == "engine failed for <request_key>"
    assert key not in json.dumps(result.to_dict())


async def test_the_key_never_reaches_info_logs(fake, make_client, caplog):
    caplog.set_level(logging.DEBUG)
    fake.add_error(400, OVERLOADED)  # a retry: logged at INFO
    fake.add_stream(Step(delta("a")), Step(delta("b"), delay_s=10.0))
    fake.add_stream(Step(delta("late"), delay_s=5.0))
    async with make_client() as client:
        stream = await cancel_after_first(client)
        first_key = stream.request_key
        task = asyncio.ensure_future(client.generate("x"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    second_key = body_of(fake.stream_requests[-1])["request_key"]
    assert any(r.levelno == logging.INFO for r in caplog.records)  # the retry was logged
    for record in caplog.records:
        if record.levelno >= logging.INFO:
            assert first_key not in record.getMessage() and second_key not in record.getMessage()


async def test_reprs_do_not_show_the_key(fake, make_client):
    fake.add_stream(Step(delta("a", finish_reason="stop", request_key=CALLER_KEY)))
    async with make_client() as client:
        result = await client.generate("x", request_key=CALLER_KEY)
    event = StreamEvent(text="a", request_key=CALLER_KEY)
    for shown in (GenerationOptions(request_key=CALLER_KEY), result, event):
        assert CALLER_KEY not in repr(shown)
    assert "request_key" not in result.to_dict()
