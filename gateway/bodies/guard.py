"""Body guards, as pure ASGI middleware in front of any parsing.

A request with a body must say `Content-Type: application/json` (415; Triton's
/v2 routes also take none or octet-stream, as tritonclient.http sends), may not
announce or send more than `max_body_bytes` (413: an announced length is
refused before reading a byte; a chunked body is read only up to the bound),
and its JSON may not nest deeper than `max_json_depth` (400; checked on the
raw bytes, so a deeply nested document never reaches a recursive parser).
The accepted body is handed on to the application as one message."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from itertools import accumulate
from typing import Any

from ..core.errors import GatewayError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Three linear passes, no backtracking: drop escape pairs (so an escaped quote
# cannot end a string), drop strings (brackets inside them do not nest), keep
# only brackets; a regex over strings with escapes inside would backtrack
# quadratically on an unterminated string.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
for _open, _close in (b"[]", b"{}"):
    _STEP[_open], _STEP[_close] = 1, -1


def json_depth(body: bytes, bound: int | None = None) -> int:
    """The deepest nesting of arrays and objects, without parsing. With
    `bound`, a body with at most `bound` opening brackets answers their count
    (an upper bound of its depth) without a scan: every real request."""
    opening = body.count(b"[") + body.count(b"{")
    if bound is not None and opening <= bound:
        return opening
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", body)).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _media_type_ok(content_type: str, path: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type == "application/json":
        return True
    # Triton's own routes take what tritonclient.http sends: no Content-Type at
    # all, or octet-stream for the binary-data extension (a JSON header, then tensors)
    return path.startswith("/v2/") and media_type in ("", "application/octet-stream")


def _json_part(body: bytes, headers: dict[bytes, bytes]) -> bytes:
    """The JSON of a body: all of it, or the header before the binary tensors
    (whose bytes may hold anything, brackets included)."""
    declared = headers.get(b"inference-header-content-length")
    if declared is not None and declared.isdigit():
        return body[: int(declared)]
    return body


async def send_error(send: Send, error: GatewayError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    if error.status == 413:
        # the rest of the body stays unread, so this connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_json_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(scope, receive)
        except GatewayError as error:
            await send_error(send, error)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes:
        headers = {k.lower(): v for k, v in scope["headers"]}
        empty = headers.get(b"content-length") == b"0"  # an action without a body (POST .../drain)
        if not empty and not _media_type_ok(headers.get(b"content-type", b"").decode("latin-1"), scope["path"]):
            raise GatewayError(415, "Content-Type must be application/json.", code="unsupported_media_type")
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise GatewayError(400, "Content-Length is not a number.") from None
            if length > self.max_body_bytes:
                raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise GatewayError(400, "The client disconnected while sending the body.")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if json_depth(_json_part(body, headers), self.max_json_depth) > self.max_json_depth:
            raise GatewayError(400, f"JSON nesting deeper than {self.max_json_depth} levels.", code="json_too_deep")
        return body

    def _too_large(self) -> GatewayError:
        return GatewayError(413, f"The request body exceeds {self.max_body_bytes} bytes.", code="request_too_large")


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # after the body, the application only waits for the disconnect
        return await receive()

    return replay
