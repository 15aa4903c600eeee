"""A scripted fake Triton HTTP frontend for httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def delta(text: str, finish_reason: str | None = None, tokens: int = 1, **extra: Any) -> dict[str, Any]:
    body = {"model_name": "ensemble", "model_version": "1", "text_output": text, "num_output_tokens": tokens}
    if finish_reason:
        body["finish_reason"] = finish_reason
    body.update(extra)
    return body


@dataclass
class Step:
    """One chunk of a scripted stream: wait `delay_s`, then send `data` (or raise `exc`)."""

    data: dict[str, Any] | None = None
    delay_s: float = 0.0
    exc: Exception | None = None


@dataclass
class FakeTriton:
    """Answers generate_stream from a list of scripted replies (one per attempt)
    and records every request, including `stop` requests."""

    replies: list[Callable[[httpx.Request], httpx.Response]] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)
    stop_status: int = 200
    stop_error: str = "unknown request id"  # the `error` text of a refused stop (stop_status != 200)
    closed_streams: int = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.endswith("/generate"):
            self.stops.append(json.loads(request.content))
            if self.stop_status != 200:
                return httpx.Response(self.stop_status, json={"error": self.stop_error})
            return httpx.Response(200, json={"model_name": "python_llm"})
        if not self.replies:
            raise AssertionError("unexpected extra request")
        return self.replies.pop(0)(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    @property
    def stream_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path.endswith("/generate_stream")]

    def add_stream(self, *steps: Step) -> None:
        async def body() -> AsyncIterator[bytes]:
            try:
                for step in steps:
                    if step.delay_s:
                        await asyncio.sleep(step.delay_s)
                    if step.exc is not None:
                        raise step.exc
                    if step.data is not None:
                        yield sse(step.data)
            finally:
                self.closed_streams += 1

        self.replies.append(
            lambda request: httpx.Response(
                200, headers={"content-type": "text/event-stream; charset=utf-8"}, content=body()
            )
        )

    def add_error(self, status: int, message: str, headers: dict[str, str] | None = None, as_sse: bool = False) -> None:
        payload = {"error": message}
        content = sse(payload) if as_sse else json.dumps(payload).encode()
        self.replies.append(lambda request: httpx.Response(status, headers=headers, content=content))

    def add_connect_error(self) -> None:
        def fail(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("connection refused", request=request)

        self.replies.append(fail)
