"""Triton's error shape over HTTP (`{"error": "<message>"}`, for every refusal
under /v2, whichever layer refused: the body guard, authentication, the
routes), the SSE error event of `generate_stream`, and the response that
computes a whole answer while watching for the caller hanging up."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import GatewayError
from ..core.hangup import HungUp, unless_hung_up

log = logging.getLogger(__name__)

# nginx's status for "the client closed the request": only ever logged, nobody receives it
CLIENT_CLOSED_REQUEST = 499
INTERNAL = GatewayError(500, "Internal error.", code="internal_error")


def dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def error_body(error: GatewayError) -> bytes:
    return dumps({"error": error.message})


def error_event(error: GatewayError) -> bytes:
    """generate_stream's error, as Triton sends one: a last `data:` event."""
    return b"data: " + error_body(error) + b"\n\n"


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + dumps(body) + b"\n\n"


def is_triton_path(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


@dataclass
class Answer:
    """A computed whole answer."""

    body: bytes
    status: int = 200
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def error_answer(error: GatewayError) -> Answer:
    return Answer(error_body(error), error.status, headers=dict(error.headers))


class WholeAnswer(Response):
    """An answer computed while the caller is still there: the computation
    (the engine request with it) is cancelled the moment it hangs up, which
    FastAPI's plain handlers would not notice. A GatewayError raised by the
    computation is the answer, in Triton's shape."""

    def __init__(self, compute: Callable[[], Awaitable[Answer]], headers: dict[str, str]) -> None:
        super().__init__(status_code=200, headers=headers)
        self._compute = compute
        self._given_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            answer = await unless_hung_up(self._answer(), receive)
        except HungUp:
            return  # nobody to answer
        self.status_code = answer.status
        self.body = answer.body
        self.media_type = answer.media_type
        self.init_headers({**self._given_headers, **answer.headers})
        await super().__call__(scope, receive, send)

    async def _answer(self) -> Answer:
        try:
            return await self._compute()
        except GatewayError as error:
            return error_answer(error)
        except Exception:
            log.exception("unhandled error computing an answer")
            return error_answer(INTERNAL)


class TritonErrorShape:
    """ASGI: under /v2, an error answer in OpenAI's shape (`{"error":
    {"message", ...}}`, what the guard and the app's handlers write) is
    rewritten to Triton's `{"error": "<message>"}`. Only error statuses are
    buffered (they are small); everything else passes through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_triton_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def send_shaped(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await _send_reshaped(send, start, b"".join(chunks))

        await self.app(scope, receive, send_shaped)


async def _send_reshaped(send: Send, start: Message, body: bytes) -> None:
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        body = dumps({"error": error["message"]})
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        start = {**start, "headers": headers + [(b"content-length", str(len(body)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
