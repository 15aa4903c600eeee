"""The blocking wrapper and the CLI, against the scripted fake server."""

from __future__ import annotations

import io
import json
import re

import pytest

import client.cli as cli
from client import ClientConfig, LLMClient
from client.sse_transport import SseTransport
from tests.unit.client.sse_fakes import Step, delta


@pytest.fixture
def patched_cli(fake, monkeypatch):
    def make(config: ClientConfig) -> LLMClient:
        return LLMClient(config, transport=SseTransport(config.url, config.timeouts, http_transport=fake.transport()))

    monkeypatch.setattr(cli, "LLMClient", make)


def test_sync_stream_yields_events_and_fills_the_result(fake):
    fake.add_stream(Step(delta("a")), Step(delta("b", finish_reason="stop")))
    config = ClientConfig(url="http://triton.test")
    with LLMClient(config, transport=SseTransport(config.url, config.timeouts, http_transport=fake.transport())) as c:
        events, result = c.stream_with_result("x")
        assert [e.text for e in events] == ["a", "b"]
    assert result.text == "ab" and result.finish_reason == "stop"


def test_generate_json_prints_the_result(fake, patched_cli):
    fake.add_stream(Step(delta("Paris", num_input_tokens=9)), Step(delta(".", finish_reason="stop")))
    out = io.StringIO()
    assert cli.main(["generate", "Capital of France?", "--json", "--temperature", "0"], out=out) == 0
    printed = json.loads(out.getvalue())
    assert printed["text"] == "Paris." and printed["finish_reason"] == "stop" and printed["num_input_tokens"] == 9
    assert json.loads(fake.stream_requests[0].content)["temperature"] == 0.0


def test_chat_keeps_history_and_resets(fake, patched_cli):
    fake.add_stream(Step(delta("Hi!", finish_reason="stop")))
    fake.add_stream(Step(delta("Bob.", finish_reason="stop")))
    fake.add_stream(Step(delta("?", finish_reason="stop")))
    out = io.StringIO()
    stdin = io.StringIO("hello\nmy name?\n/reset\nagain\n/quit\n")
    assert cli.main(["chat", "--system", "be brief"], out=out, stdin=stdin) == 0
    sent = [json.loads(json.loads(r.content)["messages"]) for r in fake.stream_requests]
    assert sent[1] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "my name?"},
    ]
    assert sent[2] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "again"}]
    assert "TTFT" in out.getvalue() and "TPOT" in out.getvalue()


def test_generate_json_keeps_the_request_key_secret(fake, patched_cli):
    fake.add_stream(Step(delta("Paris.", finish_reason="stop")))
    out = io.StringIO()
    assert cli.main(["generate", "Capital of France?", "--json"], out=out) == 0
    sent_key = json.loads(fake.stream_requests[0].content)["request_key"]
    # contract.request_key.mint_request_key: secrets.token_urlsafe(24), 32 URL-safe characters
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", sent_key) and sent_key not in out.getvalue()
    assert "request_key" not in json.loads(out.getvalue())
