"""The Responses API inside one process: the real app, the real `openai` SDK
(over httpx's ASGI transport), a scripted engine. Whole, streamed and
background responses; a background stream dropped mid-way resumed with the
SDK's own `retrieve(id, stream=True, starting_after=N)`; cancel; refusals."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from gateway.config import TierConfig
from tests.unit.gateway.asgi_driver import call
from tests.unit.gateway.openai_fakes import AUTH, GOOD_KEY, HANG, OTHER_KEY, ev, harness, simple_script
from tests.unit.gateway.test_streams import WORDS, paced, until


def sdk(h, key: str = GOOD_KEY) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=h.app), base_url="http://gw")
    return openai.AsyncOpenAI(base_url="http://gw/v1", api_key=key, http_client=http, max_retries=0)


def test_a_whole_response_has_the_text_usage_and_the_conversation_upstream():
    h = harness(simple_script("Hello", " there", "!"))

    async def scenario():
        return await sdk(h).responses.create(
            model="ensemble", input="Hi", instructions="Be brief.", max_output_tokens=16, temperature=0
        )

    response = asyncio.run(scenario())
    assert response.status == "completed" and response.output_text == "Hello there!"
    assert response.id.startswith("resp_") and response.output[0].role == "assistant"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (5, 3)
    ((_, values, _),) = h.transport.opened
    assert json.loads(values["messages"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert values["max_tokens"] == 16 and values["priority"] == 7


def test_a_streamed_response_has_typed_events_in_sequence():
    h = harness(simple_script("Hel", "lo", finish="length"))

    async def scenario():
        stream = await sdk(h).responses.create(model="ensemble", input="Hi", stream=True)
        return [event async for event in stream]

    events = asyncio.run(scenario())
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello"
    final = events[-1].response
    assert final.incomplete_details.reason == "max_output_tokens" and final.usage.output_tokens == 2


def test_a_dropped_background_stream_resumes_with_the_sdks_starting_after():
    h = harness(lambda *a: paced(*WORDS), tier=TierConfig(priority=7, stream_grace_s=0))
    body = json.dumps({"model": "ensemble", "input": "Hi", "stream": True, "background": True}).encode()

    async def scenario():
        first = await call(h.app, "POST", "/v1/responses", headers=AUTH, body=body, hang_up_after=6)
        response_id = first.headers["x-stream-id"]
        seen = [json.loads(d) for d in first.data()]
        # a grace period of 0 would stop a plain stream at once: a background one goes on
        rest = await sdk(h).responses.retrieve(response_id, stream=True, starting_after=seen[-1]["sequence_number"])
        return seen, [event async for event in rest]

    seen, rest = asyncio.run(scenario())
    numbers = [e["sequence_number"] for e in seen] + [e.sequence_number for e in rest]
    assert numbers == list(range(len(numbers))), "events lost or repeated across the resume"
    text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
    text += "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == "".join(WORDS) and rest[-1].type == "response.completed"
    assert h.transport.stops == []


def test_a_background_response_runs_to_its_end_unread_and_is_read_later():
    h = harness(lambda *a: paced(*WORDS), tier=TierConfig(priority=7, stream_grace_s=0.05))

    async def scenario():
        client = sdk(h)
        created = await client.responses.create(model="ensemble", input="Hi", background=True)
        assert created.status in ("queued", "in_progress")
        for _ in range(500):
            current = await client.responses.retrieve(created.id)
            if current.status == "completed":
                return created, current
            await asyncio.sleep(0.01)
        raise AssertionError("the background response never completed")

    created, done = asyncio.run(scenario())
    assert done.output_text == "".join(WORDS) and done.usage.output_tokens == len(WORDS)
    assert h.transport.stops == [] and h.policy.admissions[0].released == 1


def test_cancelling_a_background_response_stops_it_and_another_key_gets_404():
    h = harness(lambda *a: [ev("first", ids=(1,)), HANG])

    async def scenario():
        client = sdk(h)
        created = await client.responses.create(model="ensemble", input="Hi", background=True)
        await until(lambda: h.transport.opened)
        with pytest.raises(openai.NotFoundError):
            await sdk(h, OTHER_KEY).responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await sdk(h, OTHER_KEY).responses.cancel(created.id)
        cancelled = await client.responses.cancel(created.id)
        return cancelled, list(h.transport.stops)

    cancelled, stops = asyncio.run(scenario())
    assert cancelled.status == "cancelled" and len(stops) == 1
    assert h.policy.admissions[0].released == 1


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ],
)
def test_what_this_server_cannot_honour_is_a_400_naming_it(extra, param):
    h = harness(simple_script("x"))
    body = json.dumps({"model": "ensemble", "input": "Hi", **extra}).encode()
    exchange = asyncio.run(call(h.app, "POST", "/v1/responses", headers=AUTH, body=body))
    assert exchange.status == 400, exchange.body
    error = json.loads(exchange.body)["error"]
    assert error["param"] == param and (param != "input" or "input_image" in error["message"])
    assert h.transport.opened == []


def test_background_without_store_is_refused():
    h = harness(simple_script("x"))
    body = json.dumps({"model": "ensemble", "input": "Hi", "background": True, "store": False}).encode()
    exchange = asyncio.run(call(h.app, "POST", "/v1/responses", headers=AUTH, body=body))
    assert exchange.status == 400 and b"background: requires store" in exchange.body
