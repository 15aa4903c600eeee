"""Resumable streams inside one process: the real app and client library, a
scripted engine (openai_fakes), an ASGI driver that hangs up mid-stream.
A dropped stream resumes with `Last-Event-ID` into exactly the uninterrupted
answer; nobody back within the grace period stops the engine request; DELETE
stops it at once; another key gets 404, a position past the buffer 410;
keep-alive comments flow while the engine has not answered."""

from __future__ import annotations

import asyncio
import json
import time

from client.errors import RequestError
from gateway.config import StreamsConfig, TierConfig
from tests.unit.gateway.asgi_driver import call
from tests.unit.gateway.openai_fakes import AUTH, HANG, OTHER_KEY, Pause, ev, harness

CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "stream": True}
BODY = json.dumps(CHAT).encode()
WORDS = ["The", " sea", " is", " wide", " and", " deep", "."]
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}


def paced(*texts: str, pause_s: float = 0.02) -> list[object]:
    items: list[object] = []
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        items += [Pause(pause_s), ev(text, ids=(100 + i,), finish="stop" if last else None, final=last)]
    return items


def grace(seconds: float) -> TierConfig:
    return TierConfig(priority=7, stream_grace_s=seconds)


def content(data: list[str]) -> str:
    out = []
    for payload in data:
        if payload == "[DONE]":
            continue
        for choice in json.loads(payload).get("choices", []):
            out.append(choice["delta"].get("content") or "")
    return "".join(out)


async def until(predicate, bound_s: float = 5.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < bound_s, f"not within {bound_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def test_a_dropped_stream_resumed_with_last_event_id_yields_exactly_the_rest():
    h = harness(lambda *a: paced(*WORDS), tier=grace(5))

    async def scenario():
        first = await call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=3)
        stream_id = first.headers["x-stream-id"]
        assert stream_id.startswith("chatcmpl-") and first.status == 200
        last = first.ids()[-1]
        rest = await call(h.app, "GET", f"/v1/streams/{stream_id}", headers={**AUTH, "Last-Event-ID": str(last)})
        return first, rest

    first, rest = asyncio.run(scenario())
    assert rest.status == 200 and rest.headers["content-type"].startswith("text/event-stream")
    ids = first.ids() + rest.ids()
    assert ids == list(range(1, len(ids) + 1)), "events lost or repeated across the resume"
    assert content(first.data() + rest.data()) == "".join(WORDS)
    assert rest.data()[-1] == "[DONE]"
    assert h.transport.stops == [], "a completed stream needs no stop"
    assert h.policy.admissions[0].released == 1


def test_a_stream_nobody_resumes_is_stopped_after_its_grace_period():
    h = harness(lambda *a: [ev("first", ids=(1,)), HANG], tier=grace(0.3))

    async def scenario() -> tuple[float, float]:
        await call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        dropped = time.monotonic()
        await asyncio.sleep(0.15)
        assert h.transport.stops == [], "stopped before the grace period ended"
        await until(lambda: h.transport.stops)
        stopped_after = time.monotonic() - dropped
        await until(lambda: h.policy.admissions[0].released == 1)
        return stopped_after, 0.0

    stopped_after, _ = asyncio.run(scenario())
    ((model, _, key),) = h.transport.stops
    assert model == "python_llm" and len(key) == 32
    assert 0.3 <= stopped_after < 3.0, stopped_after


def test_delete_stops_at_once_and_another_key_gets_404():
    h = harness(lambda *a: [ev("first", ids=(1,)), HANG], tier=grace(30))

    async def scenario():
        first = await call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        stream_id = first.headers["x-stream-id"]
        foreign_get = await call(h.app, "GET", f"/v1/streams/{stream_id}", headers={**OTHER, "Last-Event-ID": "1"})
        foreign_delete = await call(h.app, "DELETE", f"/v1/streams/{stream_id}", headers=OTHER)
        unknown = await call(h.app, "GET", "/v1/streams/strm_nope", headers=AUTH)
        assert h.transport.stops == []
        started = time.monotonic()
        deleted = await call(h.app, "DELETE", f"/v1/streams/{stream_id}", headers=AUTH)
        stops_at_answer = list(h.transport.stops)
        return foreign_get, foreign_delete, unknown, deleted, stops_at_answer, time.monotonic() - started

    foreign_get, foreign_delete, unknown, deleted, stops, took = asyncio.run(scenario())
    assert (foreign_get.status, foreign_delete.status, unknown.status) == (404, 404, 404)
    assert b"stream_not_found" in foreign_get.body and b"stream_not_found" in unknown.body
    assert deleted.status == 204 and len(stops) == 1, "DELETE answered before the engine request was stopped"
    assert took < 2.0
    assert h.policy.admissions[0].released == 1


def test_a_resume_from_before_the_buffer_is_410_and_a_bad_position_400():
    # 64 bytes keep about one chunk: the early events are gone by the end
    h = harness(lambda *a: paced(*WORDS, pause_s=0.005), tier=grace(5), streams=StreamsConfig(buffer_bytes=64))

    async def scenario():
        first = await call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        stream_id = first.headers["x-stream-id"]
        session = h.streams.find(stream_id, await h.policy.authenticate(AUTH["Authorization"]))
        await until(lambda: session.done)
        gone = await call(h.app, "GET", f"/v1/streams/{stream_id}", headers={**AUTH, "Last-Event-ID": "1"})
        bad = await call(h.app, "GET", f"/v1/streams/{stream_id}", headers={**AUTH, "Last-Event-ID": "x"})
        future = await call(h.app, "GET", f"/v1/streams/{stream_id}", headers={**AUTH, "Last-Event-ID": "999"})
        return gone, bad, future

    gone, bad, future = asyncio.run(scenario())
    assert gone.status == 410 and b"stream_gone" in gone.body
    assert bad.status == 400 and b"Last-Event-ID" in bad.body
    assert future.status == 400


def test_keepalive_comments_flow_until_the_first_token():
    h = harness(
        lambda *a: [Pause(0.35), ev("late", ids=(1,), finish="stop", final=True)],
        tier=grace(5),
        streams=StreamsConfig(keepalive_interval_s=0.05),
    )
    exchange = asyncio.run(call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY))
    assert exchange.status == 200
    before_first = exchange.body.split(b"data: ", 1)[0]
    assert before_first.count(b": keep-alive\n") >= 3, exchange.body[:200]
    assert content(exchange.data()) == "late"


def test_a_refusal_after_the_keepalives_began_is_the_streams_last_event():
    overloaded = RequestError("in ensemble 'ensemble', overloaded: the waiting queue is full (9)")
    h = harness(lambda *a: [Pause(0.2), overloaded], tier=grace(5), streams=StreamsConfig(keepalive_interval_s=0.05))
    exchange = asyncio.run(call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY))
    assert exchange.status == 200 and b": keep-alive" in exchange.body
    error = json.loads(exchange.data()[-1])["error"]
    assert error["code"] == "overloaded"
    assert h.policy.admissions[0].released == 1


def test_a_refusal_before_the_first_keepalive_is_still_an_http_status():
    overloaded = RequestError("in ensemble 'ensemble', overloaded: the waiting queue is full (9)")
    h = harness(lambda *a: [overloaded], tier=grace(5))
    exchange = asyncio.run(call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY))
    assert exchange.status == 503 and exchange.headers["retry-after"] == "1"
    assert h.policy.admissions[0].released == 1


def test_a_drain_stops_a_hung_up_stream_at_once_and_one_that_hangs_up_during_it():
    """Nobody resumes a stream through a gateway that is going away: the drain
    does not wait out a dropped stream's grace period (serve's Ctrl-C bound)."""
    h = harness(lambda *a: [ev("first", ids=(1,)), HANG], tier=grace(30.0))

    async def scenario() -> tuple[float, float]:
        await call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        streams, t0 = h.streams, time.monotonic()
        streams.expire_unread()  # the app's drain hook, as the drain begins (gateway/lifecycle/drain.py)
        await until(lambda: len(h.transport.stops) == 1)
        at_once = time.monotonic() - t0
        # a reader that leaves after the drain began: stopped at its detach, not 30 s later
        await call(h.app, "POST", "/v1/chat/completions", headers=AUTH, body=BODY, hang_up_after=1)
        t1 = time.monotonic()
        await until(lambda: len(h.transport.stops) == 2)
        assert streams.running() == 0
        return at_once, time.monotonic() - t1

    first, second = asyncio.run(scenario())
    assert first < 1.0 and second < 1.0, (first, second)
