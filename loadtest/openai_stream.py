"""One streaming request through the gateway's OpenAI API, in blocking
(gevent-friendly) code for Locust: httpx + httpx-sse, as the SSE user does,
rather than the `openai` SDK, so that timings are the wire's own.

Chat prompts go to `/v1/chat/completions`, raw ones to `/v1/completions`. An
abandoned stream is simply closed: the gateway stops the engine request when
its caller hangs up, so no `stop` (nor any request key) is needed here."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from httpx_sse import connect_sse

from .streams import StreamOutcome, StreamRequest, _should_cancel

REQUEST_TYPE = "OpenAI"


def openai_body(request: StreamRequest) -> tuple[str, dict[str, Any]]:
    """(path under the base URL, JSON body)."""
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.ignore_eos:
        body["ignore_eos"] = True
    if request.chat:
        return "/chat/completions", {**body, "messages": [{"role": "user", "content": request.prompt}]}
    return "/completions", {**body, "prompt": request.prompt}


def _delta_text(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


def _error_text(response: httpx.Response) -> str:
    try:
        return str(json.loads(response.read())["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def run_openai(http: httpx.Client, request: StreamRequest, token_timeout_s: float) -> StreamOutcome:
    """`http` has the gateway's base URL (ending in /v1) and the API key header."""
    outcome = StreamOutcome(REQUEST_TYPE, request.request_id, sent_s=time.perf_counter())
    path, body = openai_body(request)
    try:
        # a path relative to the client's base URL (httpx keeps its /v1)
        with connect_sse(
            http,
            "POST",
            path,
            json=body,
            headers={"x-request-id": request.request_id},
            timeout=httpx.Timeout(10.0, read=token_timeout_s),
        ) as source:
            if source.response.status_code != 200:
                outcome.error = f"HTTP {source.response.status_code}: {_error_text(source.response)}"
                return outcome
            for sse in source.iter_sse():
                if sse.data == "[DONE]":
                    break
                data = json.loads(sse.data)
                if "error" in data:
                    outcome.error = str(data["error"].get("message", data["error"]))
                    break
                at = time.perf_counter()
                for choice in data.get("choices") or ():
                    text = _delta_text(choice)
                    if text:
                        outcome.text += text
                        outcome.token_times_s.append(at)
                    if choice.get("finish_reason"):
                        outcome.finish_reason = choice["finish_reason"]
                if _should_cancel(outcome, request):
                    outcome.cancelled = True
                    break
    except (httpx.HTTPError, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.end_s = time.perf_counter()
    return outcome
