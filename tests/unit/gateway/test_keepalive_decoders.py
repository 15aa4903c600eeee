"""The gateway's keep-alives through the SSE decoders its callers use: the
`openai` SDK (sync and async; chat, completions, Responses), `httpx-sse`,
and HTML's own event-stream algorithm (what a browser's EventSource runs).

The bytes are the real app's (scripted engine, openai_fakes): a stream
silent before its first event and between events for several keep-alive
intervals. The keep-alive of before issue 48, a comment BLOCK (`: keep-alive`
and a blank line), is produced by the same app with the constant swapped
back: after an event with an `id:` the SDK's decoder, which keeps the last id
across events as the spec says, dispatched an empty event and failed on
json.loads(""). The comment LINE sent now ends no event, so it dispatches
nothing anywhere: before the first event, mid-stream, or as the last bytes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from functools import cache

import httpx
import openai
import pytest
from httpx_sse import aconnect_sse, connect_sse

from gateway.config import StreamsConfig
from gateway.streams import serve
from tests.unit.gateway.asgi_driver import call
from tests.unit.gateway.openai_fakes import AUTH, Pause, ev, harness

OLD_KEEPALIVE = b": keep-alive\n\n"
NEW_KEEPALIVE = serve.KEEPALIVE
WORDS = ["The", " sea", " is", " wide", "."]
INTERVAL_S = 0.02
REQUESTS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    "completions": ("/v1/completions", {"prompt": "Hi"}),
    "responses": ("/v1/responses", {"input": "Hi"}),
}


def quiet_script(*args: object) -> list[object]:
    """Silent before the first token and between tokens, several intervals each time."""
    items: list[object] = []
    for i, word in enumerate(WORDS):
        last = i == len(WORDS) - 1
        items += [Pause(INTERVAL_S * 6), ev(word, ids=(100 + i,), finish="stop" if last else None, final=last)]
    return items


@cache  # an app a body: the same bytes serve every decoder
def gateway_chunks(route: str, keepalive: bytes) -> tuple[bytes, ...]:
    """The body the gateway sends for one streamed request, chunk by chunk as sent."""
    path, fields = REQUESTS[route]
    body = json.dumps({"model": "ensemble", "temperature": 0, "stream": True, **fields}).encode()
    h = harness(quiet_script, streams=StreamsConfig(keepalive_interval_s=INTERVAL_S))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve, "KEEPALIVE", keepalive)
        exchange = asyncio.run(call(h.app, "POST", path, headers=AUTH, body=body))
    assert exchange.status == 200, exchange.body[:300]
    return tuple(exchange.chunks)


def cut_after_a_keepalive(chunks: tuple[bytes, ...], keepalive: bytes) -> tuple[bytes, ...]:
    """The stream broken off right after the first keep-alive that follows an
    event: a keep-alive as a stream's last bytes (a reader cut off by the buffer)."""
    first_event = next(i for i, c in enumerate(chunks) if c.startswith(b"id: "))
    cut = next(i for i in range(first_event, len(chunks)) if chunks[i] == keepalive)
    return chunks[: cut + 1]


def transport(chunks: tuple[bytes, ...]) -> httpx.MockTransport:
    """Serves `chunks` as an SSE body, each as its own read (so a decoder sees
    the gateway's chunk boundaries), to a sync or an async client."""

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}

        class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                yield from chunks

            async def __aiter__(self) -> AsyncIterator[bytes]:
                for chunk in chunks:
                    yield chunk

        return httpx.Response(200, headers=headers, stream=Body())

    return httpx.MockTransport(handler)


def sdk_text(route: str, chunks: tuple[bytes, ...], asynchronous: bool) -> str:
    """The text the official SDK reads from the body."""
    kwargs: dict = {"model": "ensemble", "stream": True}
    if route == "chat":
        kwargs["messages"] = REQUESTS["chat"][1]["messages"]
    elif route == "completions":
        kwargs["prompt"] = "Hi"
    else:
        kwargs["input"] = "Hi"

    def text_of(item: object) -> str:
        if route == "chat":
            return "".join(c.delta.content or "" for c in item.choices)  # type: ignore[attr-defined]
        if route == "completions":
            return "".join(c.text for c in item.choices)  # type: ignore[attr-defined]
        return item.delta if item.type == "response.output_text.delta" else ""  # type: ignore[attr-defined]

    def create(client: openai.OpenAI | openai.AsyncOpenAI) -> Callable[..., object]:
        return {
            "chat": client.chat.completions.create,
            "completions": client.completions.create,
            "responses": client.responses.create,
        }[route]

    if not asynchronous:
        client = openai.OpenAI(
            base_url="http://gw/v1", api_key="k", max_retries=0, http_client=httpx.Client(transport=transport(chunks))
        )
        return "".join(text_of(item) for item in create(client)(**kwargs))  # type: ignore[attr-defined]

    async def read() -> str:
        aclient = openai.AsyncOpenAI(
            base_url="http://gw/v1",
            api_key="k",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport(chunks)),
        )
        stream = await create(aclient)(**kwargs)  # type: ignore[misc]
        return "".join([text_of(item) async for item in stream])

    return asyncio.run(read())


def httpx_sse_data(chunks: tuple[bytes, ...], asynchronous: bool) -> list[str]:
    """The data of every event httpx-sse dispatches."""
    if not asynchronous:
        with httpx.Client(transport=transport(chunks)) as client:
            with connect_sse(client, "POST", "http://gw/v1/x") as source:
                return [sse.data for sse in source.iter_sse()]

    async def read() -> list[str]:
        async with httpx.AsyncClient(transport=transport(chunks)) as client:
            async with aconnect_sse(client, "POST", "http://gw/v1/x") as source:
                return [sse.data async for sse in source.aiter_sse()]

    return asyncio.run(read())


def whatwg_data(body: bytes) -> list[str]:
    """HTML's "event stream interpretation", as a browser's EventSource runs
    it: a blank line dispatches, unless the data buffer is empty; comment lines
    are ignored; at the end of the stream, pending data is discarded."""
    dispatched, data = [], ""
    *lines, _incomplete = re.split(r"\r\n|\r|\n", body.decode())
    for line in lines:
        if line == "":
            if data:
                dispatched.append(data.removesuffix("\n"))
            data = ""
        elif not line.startswith(":"):
            field, colon, value = line.partition(":")
            if field == "data":
                data += (value[1:] if colon and value.startswith(" ") else value) + "\n"
    return dispatched


def data_lines(chunks: tuple[bytes, ...]) -> list[str]:
    return [m.decode() for m in re.findall(rb"^data: (.*)$", b"".join(chunks), re.MULTILINE)]


@pytest.mark.parametrize("route", list(REQUESTS))
def test_keepalives_flow_before_the_first_event_and_between_events(route):
    chunks = gateway_chunks(route, NEW_KEEPALIVE)
    events = [i for i, chunk in enumerate(chunks) if chunk.startswith(b"id: ")]
    before, between = chunks[: events[0]].count(NEW_KEEPALIVE), chunks[events[0] : events[-1]].count(NEW_KEEPALIVE)
    print(
        f"\n[{route}: {before} keep-alives before the first event, {between} between its events, "
        f"interval {INTERVAL_S} s, silences of {INTERVAL_S * 6} s]"
    )
    # the first comment comes after the first interval waited before the 200; timers slip on a busy box
    assert before >= 1 and between >= len(WORDS) - 1
    assert OLD_KEEPALIVE not in b"".join(chunks), "a comment block: it ends an event"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["OpenAI", "AsyncOpenAI"])
@pytest.mark.parametrize("route", list(REQUESTS))
def test_the_openai_sdk_reads_the_keepalives_and_failed_on_the_old_ones(route, asynchronous):
    assert sdk_text(route, gateway_chunks(route, NEW_KEEPALIVE), asynchronous) == "".join(WORDS)
    with pytest.raises(json.JSONDecodeError):
        sdk_text(route, gateway_chunks(route, OLD_KEEPALIVE), asynchronous)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["OpenAI", "AsyncOpenAI"])
@pytest.mark.parametrize("route", list(REQUESTS))
def test_a_keepalive_as_the_last_bytes_ends_the_sdks_stream_quietly(route, asynchronous):
    cut = cut_after_a_keepalive(gateway_chunks(route, NEW_KEEPALIVE), NEW_KEEPALIVE)
    assert cut[-1] == NEW_KEEPALIVE
    assert WORDS[0].startswith(sdk_text(route, cut, asynchronous))  # what came before the cut, nothing more
    old_cut = cut_after_a_keepalive(gateway_chunks(route, OLD_KEEPALIVE), OLD_KEEPALIVE)
    with pytest.raises(json.JSONDecodeError):
        sdk_text(route, old_cut, asynchronous)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("route", list(REQUESTS))
def test_httpx_sse_dispatches_exactly_the_events_and_dispatched_empty_ones_before(route, asynchronous):
    chunks = gateway_chunks(route, NEW_KEEPALIVE)
    assert httpx_sse_data(chunks, asynchronous) == data_lines(chunks)
    assert httpx_sse_data(cut_after_a_keepalive(chunks, NEW_KEEPALIVE), asynchronous)[-1] != ""
    old = httpx_sse_data(gateway_chunks(route, OLD_KEEPALIVE), asynchronous)
    assert "" in old, "the old comment block dispatched nothing: this test would prove nothing"


@pytest.mark.parametrize("route", list(REQUESTS))
def test_an_eventsource_dispatches_exactly_the_events(route):
    chunks = gateway_chunks(route, NEW_KEEPALIVE)
    assert whatwg_data(b"".join(chunks)) == data_lines(chunks)
    cut = cut_after_a_keepalive(chunks, NEW_KEEPALIVE)
    assert whatwg_data(b"".join(cut)) == data_lines(cut)
