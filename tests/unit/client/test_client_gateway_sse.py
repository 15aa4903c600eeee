"""The client through the gateway over SSE: a fake gateway behind
httpx.MockTransport (real httpx, real httpx-sse) that numbers its events, names
the stream in X-Stream-Id, drops connections on cue, answers resumes
(GET /v1/streams/{id} + Last-Event-ID) and cancels (DELETE)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import client.cli as cli
from client import (
    AsyncLLMClient,
    ClientConfig,
    FirstTokenTimeoutError,
    RequestError,
    RetryConfig,
    StreamResumeError,
    TimeoutConfig,
)
from client.sse_transport import SseTransport
from tests.unit.client.sse_fakes import delta

pytestmark = pytest.mark.anyio
API_KEY = "sk-gateway-test-0123456789abcdef"
STREAM_ID = "st-5f1c"
TEXTS = ["The", " capital", " of", " France", " is", " Paris", "."]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Conn:
    """What one connection (the POST, then each resume) answers.

    status != 200: that status with an error body. Else events from `first`
    (default: Last-Event-ID + 1) up to `upto` (default: the last one), then
    `drop`: "error" (connection reset), "eof" (the body just ends), "mid" (half
    an event, then reset), or None when the stream was sent to its end.
    """

    status: int = 200
    upto: int | None = None
    drop: str | None = "error"
    first: int | None = None
    connect_error: bool = False
    hang_s: float = 0.0  # silence before the first byte (queueing, prefill)


@dataclass
class FakeGateway:
    conns: list[Conn]
    payloads: list[dict[str, Any]] = field(
        default_factory=lambda: [delta(t) for t in TEXTS[:-1]] + [delta(TEXTS[-1], finish_reason="stop")]
    )
    stream_id: str | None = STREAM_ID
    delete_status: int = 204
    requests: list[httpx.Request] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "DELETE" and path == f"/v1/streams/{self.stream_id}":
            return httpx.Response(self.delete_status)
        if path.endswith("/generate"):
            return httpx.Response(200, json={"model_name": "python_llm"})  # a stop: must not happen here
        assert path == "/v2/models/ensemble/generate_stream" or (
            request.method == "GET" and path == f"/v1/streams/{self.stream_id}"
        ), path
        conn = self.conns.pop(0)
        if conn.connect_error:
            raise httpx.ConnectError("connection refused", request=request)
        if conn.status != 200:
            if request.method == "GET":  # the gateway's own routes answer errors in OpenAI's shape
                return httpx.Response(
                    conn.status,
                    json={"error": {"message": f"refused with {conn.status}", "type": "invalid_request_error"}},
                )
            return httpx.Response(conn.status, json={"error": f"refused with {conn.status}"})
        after = int(request.headers.get("last-event-id", "0"))
        first = conn.first or after + 1
        upto = len(self.payloads) if conn.upto is None else conn.upto
        headers = {"content-type": "text/event-stream"}
        if self.stream_id:
            headers["x-stream-id"] = self.stream_id
        return httpx.Response(200, headers=headers, content=self._body(first, upto, conn.drop, conn.hang_s))

    async def _body(self, first: int, upto: int, drop: str | None, hang_s: float) -> AsyncIterator[bytes]:
        yield b": keep-alive\n\n"
        await asyncio.sleep(hang_s)
        for event_id in range(first, upto + 1):
            yield f"id: {event_id}\ndata: {json.dumps(self.payloads[event_id - 1])}\n\n".encode()
            yield b": keep-alive\n\n"
        if upto >= len(self.payloads):
            return
        if drop == "mid":
            yield f"id: {upto + 1}\ndata: {json.dumps(self.payloads[upto])[:10]}".encode()
        if drop in ("error", "mid"):
            raise httpx.ReadError("connection reset by peer")

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    def sent(self, method: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method]


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def gateway_client(
    gateway: FakeGateway, sleep: RecordingSleep | None = None, timeouts: TimeoutConfig | None = None, **retry: Any
) -> AsyncLLMClient:
    config = ClientConfig(
        url="http://gateway.test",
        api_key=API_KEY,
        timeouts=timeouts or TimeoutConfig(),
        retry=RetryConfig(backoff_base_s=0.1, backoff_max_s=1.0, **retry),
    )
    transport = SseTransport(
        config.url,
        config.timeouts,
        http_transport=gateway.transport(),
        api_key=config.api_key,
        retry=config.retry,
        sleep=sleep or RecordingSleep(),
    )
    return AsyncLLMClient(config, transport=transport, sleep=RecordingSleep())


async def texts_and_result(client: AsyncLLMClient) -> tuple[list[str], Any]:
    stream = client.stream("Capital of France?", max_tokens=16)
    async with stream:
        texts = [event.text async for event in stream]
    return texts, stream.result


@pytest.mark.parametrize("drop", ["error", "eof", "mid"])
@pytest.mark.parametrize("k", [0, 1, 4, 6])
async def test_a_stream_dropped_after_k_events_resumes_with_last_event_id_and_loses_nothing(k, drop):
    gateway = FakeGateway([Conn(upto=k, drop=drop), Conn(drop=None)])
    async with gateway_client(gateway) as client:
        texts, result = await texts_and_result(client)
    assert texts == TEXTS  # no duplicate, no gap
    assert result.text == "".join(TEXTS) and result.finish_reason == "stop" and result.error is None
    assert result.resumes == 1 and result.to_dict()["resumes"] == 1 and result.attempts == 1
    (resume,) = gateway.sent("GET")
    assert resume.headers["last-event-id"] == str(k)
    assert resume.headers["accept"] == "text/event-stream"
    assert not gateway.sent("DELETE")  # the stream finished: nothing to cancel


async def test_events_the_gateway_replays_are_skipped_and_several_drops_each_resume():
    # The second connection starts again at id 1 (an overlapping replay) and drops
    # after 4; the third resumes from 4 and runs to the end.
    gateway = FakeGateway([Conn(upto=2), Conn(first=1, upto=4, drop="eof"), Conn(drop=None)])
    async with gateway_client(gateway) as client:
        texts, result = await texts_and_result(client)
    assert texts == TEXTS and result.resumes == 2 and result.finish_reason == "stop"
    assert [r.headers["last-event-id"] for r in gateway.sent("GET")] == ["2", "4"]


@pytest.mark.parametrize("status, why", [(410, "no longer buffered"), (404, "does not know the stream")])
async def test_a_refused_resume_ends_the_stream_with_an_error_saying_why(status, why):
    gateway = FakeGateway([Conn(upto=3), Conn(status=status)])
    sleep = RecordingSleep()
    async with gateway_client(gateway, sleep) as client:
        texts, result = await texts_and_result(client)
    assert texts == TEXTS[:3] and result.text == "".join(TEXTS[:3])
    assert result.finish_reason == "error" and why in result.error and f"HTTP {status}" in result.error
    assert f"stream {STREAM_ID} dropped after event 3" in result.error and f"refused with {status})" in result.error
    assert len(gateway.sent("GET")) == 1 and sleep.calls == []  # refused: not asked again
    assert result.resumes == 0


async def test_resume_attempts_are_bounded_with_jittered_backoff_then_end_with_an_error():
    gateway = FakeGateway([Conn(upto=2), Conn(status=503), Conn(connect_error=True), Conn(status=502)])
    sleep = RecordingSleep()
    async with gateway_client(gateway, sleep, resume_attempts=3, resume_backoff_max_s=0.15) as client:
        texts, result = await texts_and_result(client)
    assert texts == TEXTS[:2] and result.finish_reason == "error"
    assert "gave up after 3 attempt(s)" in result.error and "HTTP 502" in result.error
    assert len(gateway.sent("GET")) == 3
    # full jitter before the 2nd and 3rd attempt: uniform in [0, min(max, base * 2**(n-1))]
    assert len(sleep.calls) == 2
    assert 0 <= sleep.calls[0] <= 0.1 and 0 <= sleep.calls[1] <= 0.15
    # the engine may still be generating for the grace period: cancel it
    (delete,) = gateway.sent("DELETE")
    assert delete.url.path == f"/v1/streams/{STREAM_ID}"


async def test_a_transient_resume_failure_is_retried_and_the_stream_completes():
    gateway = FakeGateway([Conn(upto=5), Conn(status=503), Conn(upto=6, drop="eof"), Conn(drop=None)])
    async with gateway_client(gateway) as client:
        texts, result = await texts_and_result(client)
    assert texts == TEXTS and result.resumes == 2
    assert [r.headers["last-event-id"] for r in gateway.sent("GET")] == ["5", "5", "6"]


async def test_resume_off_ends_a_dropped_stream_with_an_error():
    gateway = FakeGateway([Conn(upto=2)])
    async with gateway_client(gateway, resume_attempts=0) as client:
        _, result = await texts_and_result(client)
    assert result.finish_reason == "error" and "resume_attempts=0" in result.error and not gateway.sent("GET")


async def test_cancel_through_the_gateway_sends_delete_never_the_python_llm_stop():
    gateway = FakeGateway([Conn(drop=None)])
    async with gateway_client(gateway) as client:
        async with client.stream("Hi", max_tokens=16) as stream:
            async for _ in stream:
                break
    assert stream.result.finish_reason == "cancelled"
    (delete,) = gateway.sent("DELETE")
    assert delete.url.path == f"/v1/streams/{STREAM_ID}"
    assert delete.headers["authorization"] == f"Bearer {API_KEY}"
    assert not [r for r in gateway.requests if r.url.path.endswith("/generate")]
    assert not client.config.sends_stop_on_cancel


async def test_a_failed_delete_is_logged_and_does_not_change_the_outcome(caplog):
    gateway = FakeGateway([Conn(drop=None)], delete_status=500)
    async with gateway_client(gateway) as client:
        async with client.stream("Hi", max_tokens=16) as stream:
            async for _ in stream:
                break
    assert stream.result.finish_reason == "cancelled" and len(gateway.sent("DELETE")) == 1
    assert "cancel of request" in caplog.text and "HTTP 500" in caplog.text


async def test_a_refused_key_is_a_request_error_and_not_retried():
    gateway = FakeGateway([Conn(status=401)])
    async with gateway_client(gateway) as client:
        with pytest.raises(RequestError, match="HTTP 401"):
            await client.generate("Hi")
    assert [r.method for r in gateway.requests] == ["POST"]


async def test_a_stream_abandoned_before_its_first_event_is_deleted_too():
    # A first-token timeout leaves the gateway generating for its grace period
    # unless told otherwise.
    gateway = FakeGateway([Conn(drop=None, hang_s=5.0)])
    async with gateway_client(gateway, timeouts=TimeoutConfig(first_token_s=0.05)) as client:
        with pytest.raises(FirstTokenTimeoutError) as timed_out:
            await client.generate("Hi", max_tokens=16)
    assert timed_out.value.result.finish_reason == "timeout"
    assert [r.method for r in gateway.requests] == ["POST", "DELETE"]


async def test_without_a_stream_id_nothing_is_resumed_or_deleted():
    gateway = FakeGateway([Conn(upto=2, drop="eof")], stream_id=None)
    async with gateway_client(gateway) as client:
        texts, result = await texts_and_result(client)
    assert texts == TEXTS[:2] and result.finish_reason is None and result.resumes == 0
    assert [r.method for r in gateway.requests] == ["POST"]  # no resume, no DELETE, no stop


async def test_the_api_key_is_sent_as_a_bearer_token_and_is_never_in_repr_logs_or_results(caplog):
    caplog.set_level(logging.DEBUG)
    gateway = FakeGateway([Conn(upto=3), Conn(status=410)])
    async with gateway_client(gateway) as client:
        _, result = await texts_and_result(client)
        assert API_KEY not in repr(client.config) and API_KEY not in str(client.config)
        assert API_KEY not in repr(client.transport._http.headers)
    assert [r.method for r in gateway.requests] == ["POST", "GET", "DELETE"]
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in gateway.requests)
    assert caplog.records and API_KEY not in caplog.text
    assert API_KEY not in json.dumps(result.to_dict()) and API_KEY not in repr(result)
    assert "resum" in caplog.text  # the drop and the refusal were logged, without the key


def test_config_validates_the_api_key_without_repeating_it():
    with pytest.raises(ValueError) as refused:
        ClientConfig(api_key="sk secret")
    assert "secret" not in str(refused.value)
    assert ClientConfig(api_key="sk-x").through_gateway and not ClientConfig().through_gateway
    assert ClientConfig().sends_stop_on_cancel and not ClientConfig(api_key="sk-x").sends_stop_on_cancel
    with pytest.raises(ValueError, match="resume_attempts"):
        RetryConfig(resume_attempts=-1)


def test_cli_takes_the_key_from_the_flag_or_the_environment_and_defaults_to_the_gateway(monkeypatch):
    parse = cli.build_parser().parse_args
    monkeypatch.delenv(cli.API_KEY_ENV, raising=False)
    assert cli._config(parse(["generate", "x"])).api_key is None
    assert cli._config(parse(["generate", "x"])).url == "http://127.0.0.1:8000"
    flagged = cli._config(parse(["generate", "x", "--api-key", "sk-flag"]))
    assert flagged.api_key == "sk-flag" and flagged.url == "http://127.0.0.1:9000"
    monkeypatch.setenv(cli.API_KEY_ENV, "sk-env")
    from_env = cli._config(parse(["generate", "x", "--transport", "grpc"]))
    assert from_env.api_key == "sk-env" and from_env.url == "127.0.0.1:9001"
    assert cli._config(parse(["generate", "x", "--url", "http://elsewhere:9000"])).url == "http://elsewhere:9000"


def test_stream_resume_error_is_a_connection_error():
    from client import ServerConnectionError

    assert issubclass(StreamResumeError, ServerConnectionError)
