"""Keep-alive comments against the real stack: a tritonserver whose engine
runs one sequence at a time (`max_num_seqs=1`), so a second request queues
behind a long one, and the gateway as its own process.

The property under test is "a client (or proxy) whose read timeout is longer
than the keep-alive interval never times out, however long the queue": it is
scaled down from nginx's 60 s against the default 15 s interval to a 4 s read
timeout against a 1 s interval, so that the wait (seconds behind a long
generation) is several read timeouts long without making CI wait minutes.

The queued requests are read three ways at once: raw lines (counting the
comments), the `openai` SDK's `OpenAI` (chat) and `AsyncOpenAI` (the
Responses API), each under that read timeout. Before the first event no `id:`
has been sent, so even the old comment blocks dispatched nothing there; the
pause after the first event, at the default interval, is
test_gateway_keepalive_sdk.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from serving.launcher import TritonServer
from tests.e2e.test_gateway_openai import Gateway, start_gateway

pytestmark = pytest.mark.e2e

KEEPALIVE_S = 1.0
READ_TIMEOUT_S = 4.0
# a floor under each engine step, so that the long request's 200 tokens take
# >= 8 s (two read timeouts) on any machine: on a fast one they took 3.7 s
# after its first token, and the queued request never waited long enough to
# show anything
STEP_DELAY_MS = 40


@pytest.fixture(scope="module")
def single_sequence(start_triton) -> TritonServer:
    return start_triton(max_num_seqs=1, debug_step_delay_ms=STEP_DELAY_MS)


@pytest.fixture(scope="module")
def gateway(single_sequence: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    started = start_gateway(
        single_sequence, tmp_path_factory.mktemp("keepalive"), f"gateway.streams.keepalive_interval_s={KEEPALIVE_S}"
    )
    yield started
    assert started.process.stop() == 0


def stream(
    gateway: Gateway, prompt: str, max_tokens: int, timeout: httpx.Timeout, first_token: threading.Event | None = None
) -> dict:
    """Read one streamed completion line by line: keep-alive comments, data
    events, and the time to the first data event."""
    seen = {"keepalives": 0, "data": [], "first_data_s": None}
    started = time.monotonic()
    body = {
        "model": "ensemble",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=timeout) as client:
        with client.stream(
            "POST", f"{gateway.base_url}/completions", json=body, headers={"Authorization": f"Bearer {gateway.key}"}
        ) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith(": keep-alive"):
                    seen["keepalives"] += 1
                elif line.startswith("data: "):
                    if seen["first_data_s"] is None:
                        seen["first_data_s"] = time.monotonic() - started
                        if first_token is not None:
                            first_token.set()
                    seen["data"].append(line[len("data: ") :])
    return seen


def sdk_chat(gateway: Gateway, seen: dict) -> None:
    """One queued chat through the SDK's `OpenAI`: its text and time to the first content."""
    started = time.monotonic()
    client = openai.OpenAI(
        base_url=gateway.base_url, api_key=gateway.key, max_retries=0, timeout=openai.Timeout(30.0, read=READ_TIMEOUT_S)
    )
    try:
        for chunk in client.chat.completions.create(
            model="ensemble", messages=[{"role": "user", "content": "Hi."}], max_tokens=8, temperature=0, stream=True
        ):
            piece = "".join(choice.delta.content or "" for choice in chunk.choices)
            if piece and "first_data_s" not in seen:
                seen["first_data_s"] = time.monotonic() - started
            seen["text"] = seen.get("text", "") + piece
    except Exception as exc:  # the failure is the finding: kept for the assertion's message
        seen["error"] = repr(exc)


async def sdk_response(gateway: Gateway, seen: dict) -> None:
    """One queued Responses stream through the SDK's `AsyncOpenAI`."""
    started = time.monotonic()
    client = openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key=gateway.key, max_retries=0, timeout=openai.Timeout(30.0, read=READ_TIMEOUT_S)
    )
    try:
        async for event in await client.responses.create(
            model="ensemble", input="Hello!", max_output_tokens=8, temperature=0, stream=True
        ):
            seen["last_type"] = event.type
            if event.type == "response.output_text.delta" and event.delta:
                seen.setdefault("first_data_s", time.monotonic() - started)
                seen["text"] = seen.get("text", "") + event.delta
    except Exception as exc:
        seen["error"] = repr(exc)
    finally:
        await client.close()


def test_a_request_queued_behind_a_long_one_completes_under_a_short_read_timeout(gateway):
    first_token = threading.Event()
    long_result: dict = {}
    long_run = threading.Thread(
        target=lambda: long_result.update(
            stream(gateway, "Tell me everything about the history of ships.", 200, httpx.Timeout(120.0), first_token)
        )
    )
    long_run.start()
    try:
        assert first_token.wait(120), "the long request never started"
        chat: dict = {}
        response: dict = {}
        sdk_runs = [
            threading.Thread(target=sdk_chat, args=(gateway, chat)),
            threading.Thread(target=lambda: asyncio.run(sdk_response(gateway, response))),
        ]
        for run in sdk_runs:
            run.start()
        # connect / write / pool as usual; `read` bounds every gap between bytes, as a proxy's does
        queued = stream(gateway, "Say hello.", 8, httpx.Timeout(30.0, read=READ_TIMEOUT_S))
    finally:
        long_run.join(180)
        for run in sdk_runs:
            run.join(60)
    waited = queued["first_data_s"]
    print(
        f"\n[queued request: first token after {waited:.1f} s behind the long one, "
        f"{queued['keepalives']} keep-alives, read timeout {READ_TIMEOUT_S} s, interval {KEEPALIVE_S} s]"
    )
    for name, seen in (("OpenAI chat", chat), ("AsyncOpenAI responses", response)):
        print(
            f"[queued {name}: first content after {seen.get('first_data_s', float('nan')):.1f} s, "
            f"text {seen.get('text')!r}, error {seen.get('error')}]"
        )
        assert seen.get("error") is None, f"{name}: {seen['error']}"
        assert seen.get("text"), f"{name}: no text"
        assert seen["first_data_s"] > READ_TIMEOUT_S, f"{name}: did not wait longer than its read timeout"
    assert response["last_type"] in ("response.completed", "response.incomplete"), response["last_type"]
    assert waited > READ_TIMEOUT_S, "the request did not wait longer than the read timeout: nothing was shown"
    # the first comment follows the first interval spent waiting before the 200, then one per
    # interval: about waited − 1 of them; timers on a loaded 2-core machine slip, so half is asked
    assert queued["keepalives"] >= int(waited / KEEPALIVE_S) // 2
    assert queued["data"][-1] == "[DONE]"
    assert "".join(json.loads(d)["choices"][0]["text"] for d in queued["data"][:-1])
    assert long_result["data"][-1] == "[DONE]"
