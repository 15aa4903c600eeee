"""Driving an ASGI app the way a network client would, with what httpx's
ASGITransport cannot do: read a streamed body chunk by chunk and hang up in
the middle of it."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any

_ID = re.compile(rb"^id: (\d+)$", re.MULTILINE)
_DATA = re.compile(rb"^data: (.*)$", re.MULTILINE)


@dataclass
class Exchange:
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def ids(self) -> list[int]:
        return [int(m) for m in _ID.findall(self.body)]

    def data(self) -> list[str]:
        return [m.decode() for m in _DATA.findall(self.body)]


async def call(
    app: Any,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    hang_up_after: int | None = None,
    timeout_s: float = 10.0,
) -> Exchange:
    """One request; with `hang_up_after`, the client disconnects once that many
    SSE events (chunks with a `data:` line) have arrived."""
    exchange = Exchange()
    enough = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        if hang_up_after is None:
            await asyncio.Event().wait()  # never hangs up; the app cancels this wait
        await enough.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            exchange.status = message["status"]
            exchange.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body" and message.get("body"):
            exchange.chunks.append(message["body"])
            if hang_up_after is not None and len(exchange.data()) >= hang_up_after:
                enough.set()

    raw_headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if body:
        raw_headers.append((b"content-type", b"application/json"))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": raw_headers,
        "http_version": "1.1",
        "scheme": "http",
        "server": ("gw", 80),
        "client": ("1.2.3.4", 5),
        "root_path": "",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
    }
    await asyncio.wait_for(app(scope, receive, send), timeout_s)
    return exchange
