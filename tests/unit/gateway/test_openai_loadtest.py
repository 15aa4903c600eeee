"""The load test's OpenAI user type: what it sends and how it reads a stream
(tokens, finish, errors, abandoning), against canned gateway answers."""

from __future__ import annotations

import json

import httpx

from loadtest.cli import user_classes
from loadtest.openai_stream import openai_body, run_openai
from loadtest.settings import LoadSettings
from loadtest.streams import StreamRequest


def chunk(text: str, finish: str | None = None) -> str:
    return (
        "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}) + "\n\n"
    )


def client(body: str, status: int = 200, seen: list | None = None) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        content_type = "text/event-stream" if status == 200 else "application/json"
        return httpx.Response(status, content=body.encode(), headers={"content-type": content_type})

    return httpx.Client(
        base_url="http://gw/v1", transport=httpx.MockTransport(handler), headers={"Authorization": "Bearer sk-x"}
    )


def request(**kwargs) -> StreamRequest:
    return StreamRequest(
        **{"model": "ensemble", "prompt": "Hi", "max_tokens": 8, "request_id": "r1", "chat": True, **kwargs}
    )


def test_a_chat_stream_is_read_to_done():
    seen: list[httpx.Request] = []
    body = chunk("Hel") + chunk("lo") + chunk("", "stop") + 'data: {"choices": [], "usage": {}}\n\ndata: [DONE]\n\n'
    outcome = run_openai(client(body, seen=seen), request(), 5.0)
    assert (outcome.request_type, outcome.text, outcome.finish_reason, outcome.error) == (
        "OpenAI",
        "Hello",
        "stop",
        None,
    )
    assert len(outcome.token_times_s) == 2
    sent = seen[0]
    assert sent.url.path == "/v1/chat/completions" and sent.headers["authorization"] == "Bearer sk-x"
    assert sent.headers["x-request-id"] == "r1"
    assert json.loads(sent.content)["messages"] == [{"role": "user", "content": "Hi"}]


def test_raw_prompts_use_completions_and_ignore_eos_passes():
    path, body = openai_body(request(chat=False, ignore_eos=True))
    assert path == "/completions" and body["prompt"] == "Hi" and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_errors_and_abandoning():
    refused = run_openai(client(json.dumps({"error": {"message": "slow down"}}), status=429), request(), 5.0)
    assert refused.error == "HTTP 429: slow down" and not refused.token_times_s
    broken = run_openai(client(chunk("a") + 'data: {"error": {"message": "engine failed"}}\n\n'), request(), 5.0)
    assert broken.error == "engine failed" and broken.text == "a"
    abandoned = run_openai(client(chunk("a") + chunk("b") + chunk("c", "length")), request(cancel_after_tokens=2), 5.0)
    assert abandoned.cancelled and abandoned.text == "ab"


def test_the_user_type_is_selectable():
    assert user_classes("sse,openai", burst_silence=False) == ["SseUser", "OpenAIUser"]
    assert user_classes("openai", burst_silence=True) == ["OpenAIBurstSilenceUser"]
    assert all("sk-" not in value for value in LoadSettings().to_env().values())
