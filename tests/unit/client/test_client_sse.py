"""SSE transport and stream semantics against a scripted fake Triton (httpx.MockTransport)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from client import GenerationOptions, RequestError
from tests.unit.client.sse_fakes import Step, delta

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_events_are_typed_and_result_accumulates(fake, make_client):
    fake.add_stream(
        Step(delta("Hel", num_input_tokens=7, output_ids=[12, 13], tokens=2)),
        Step(delta("", tokens=0)),
        Step(delta("lo", output_ids=44)),
        Step(delta("!", finish_reason="stop", output_ids=[5], arrival_time_ns=10)),
    )
    async with make_client() as client:
        stream = client.stream("Hi", max_tokens=8, temperature=0.0)
        events = [event async for event in stream]
    assert [e.text for e in events] == ["Hel", "", "lo", "!"]
    assert events[0].output_ids == (12, 13) and events[2].output_ids == (44,)
    assert events[3].finish_reason == "stop" and events[0].finish_reason is None
    assert events[3].perf_ns == {"arrival_time_ns": 10}
    result = stream.result
    assert result.text == "Hello!"
    assert result.finish_reason == "stop"
    assert result.num_input_tokens == 7
    assert result.num_output_tokens == 4
    assert result.output_ids == [12, 13, 44, 5]
    assert result.num_responses == 4
    assert len(result.itl_s) == 2  # three responses carry tokens, the empty one does not
    assert len(result.timings.chunk_gaps_s) == 3
    assert result.ttft_s is not None and result.tpot_s is not None
    assert not fake.stops  # finished normally: no stop


async def test_request_body_carries_inputs_and_request_id(fake, make_client):
    fake.add_stream(Step(delta("ok", finish_reason="stop")))
    messages = [{"role": "user", "content": "你好"}]
    options = GenerationOptions(
        max_tokens=4, stop_words=["\n\n", "END"], messages=messages, seed=7, segment="sentence", request_id="req-42"
    )
    async with make_client() as client:
        result = await client.generate("", options)
    request = fake.stream_requests[0]
    assert request.url.path == "/v2/models/ensemble/generate_stream"
    body = json.loads(request.content)
    assert body["id"] == "req-42" == result.request_id
    assert body["stream"] is True and body["max_tokens"] == 4 and body["seed"] == 7
    assert body["stop_words"] == ["\n\n", "END"]
    assert isinstance(body["messages"], str) and json.loads(body["messages"]) == messages
    assert body["segment"] == "sentence"
    assert "temperature" not in body  # unset options are not sent
    assert "request_id" not in body


async def test_request_id_is_generated_when_absent(fake, make_client):
    fake.add_stream(Step(delta("a", finish_reason="stop")))
    fake.add_stream(Step(delta("b", finish_reason="stop")))
    async with make_client() as client:
        first = await client.generate("x")
        second = await client.generate("x")
    ids = [json.loads(r.content)["id"] for r in fake.stream_requests]
    assert ids == [first.request_id, second.request_id]
    assert first.request_id != second.request_id
    # client.types.new_request_id: uuid4().hex, 32 lowercase hex digits
    assert all(re.fullmatch(r"[0-9a-f]{32}", request_id) for request_id in ids)


@pytest.mark.parametrize("as_sse", [False, True])
async def test_error_before_data_raises_request_error(fake, make_client, as_sse):
    fake.add_error(400, "max_tokens: must be > 0", as_sse=as_sse)
    async with make_client() as client:
        with pytest.raises(RequestError) as info:
            await client.generate("x", max_tokens=3)
    assert info.value.status == 400
    assert info.value.message == "max_tokens: must be > 0"
    assert len(fake.stream_requests) == 1  # not retryable
    assert not fake.stops  # rejected requests are not running: no stop


async def test_error_after_streaming_began_ends_with_finish_reason_error(fake, make_client):
    fake.add_stream(Step(delta("partial ")), Step({"error": "engine failed"}))
    async with make_client() as client:
        result = await client.generate("x")
    assert result.text == "partial "
    assert result.finish_reason == "error"
    assert result.error == "engine failed"


async def test_connection_drop_mid_stream_is_an_error_result_and_stops_ensemble(fake, make_client):
    fake.add_stream(Step(delta("partial")), Step(exc=httpx.ReadError("reset")))
    async with make_client() as client:
        result = await client.generate("x")
    assert result.finish_reason == "error" and "broke" in result.error
    assert len(fake.stream_requests) == 1  # data had arrived: never retried
    assert [s["id"] for s in fake.stops] == [result.request_id]


def test_options_are_validated():
    with pytest.raises(ValueError, match=r"^max_tokens: must be >= 1, got 0$"):
        GenerationOptions(max_tokens=0)
    with pytest.raises(ValueError, match=r"^top_p: must be in \(0, 1\], got 1\.5$"):
        GenerationOptions(top_p=1.5)
    with pytest.raises(ValueError, match=r"^stop_words: must be a list of strings, not one string$"):
        GenerationOptions(stop_words="END")  # a bare string is not a list of words
    with pytest.raises(ValueError, match=r"^messages\[0\] must be a dict with string 'role' and 'content'$"):
        GenerationOptions(messages=[{"role": "user"}])
    with pytest.raises(
        ValueError,
        match=r"^segment must be one of \('token', 'sentence', 'paragraph'\) "
        r"\(got 'word'\)$",
    ):
        GenerationOptions(segment="word")


async def test_empty_prompt_without_messages_is_refused_locally(make_client):
    async with make_client() as client:
        with pytest.raises(ValueError, match=r"^text_input must not be empty unless messages are given$"):
            client.stream("")
