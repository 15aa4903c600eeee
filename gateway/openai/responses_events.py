"""The Responses API's objects as plain dicts: the `response` object (its
state at any moment) and the typed SSE events of a streamed response, each
with its `sequence_number` (0, 1, ...: the stream's SSE id minus one, so that
`starting_after=N` and `Last-Event-ID: N+1` name the same place)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from .responses_schema import ResponseRequest

# engine finish reason -> why a response is incomplete (the rest complete it)
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def event(kind: str, sequence_number: int, **fields: Any) -> bytes:
    payload = {"type": kind, "sequence_number": sequence_number, **fields}
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()


@dataclass
class ResponseState:
    """One response as it grows; `snapshot()` is what GET /v1/responses/{id} answers."""

    response_id: str
    model: str
    request: ResponseRequest
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "queued"
    text: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    engine_finish: str | None = None
    error: dict[str, str] | None = None
    sequence: int = 0

    @property
    def item_id(self) -> str:
        return "msg_" + self.response_id.removeprefix("resp_")

    def item(self, done: bool) -> dict[str, Any]:
        content = [self.part()] if done or self.text else []
        return {
            "id": self.item_id,
            "type": "message",
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": content,
        }

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def snapshot(self) -> dict[str, Any]:
        finished = self.status in ("completed", "incomplete")
        reason = _INCOMPLETE.get(self.engine_finish or "")
        request = self.request
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": bool(request.background),
            "error": self.error,
            "incomplete_details": {"reason": reason} if self.status == "incomplete" else None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "model": self.model,
            "output": [self.item(finished)] if (self.text or finished) else [],
            "parallel_tool_calls": False,
            "previous_response_id": None,
            "reasoning": None,
            "store": request.store is not False,
            "temperature": request.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "top_p": request.top_p,
            "truncation": "disabled",
            "usage": self.usage() if finished else None,
            "user": request.user,
            "metadata": request.metadata or {},
        }

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }

    def next(self, kind: str, **fields: Any) -> bytes:
        rendered = event(kind, self.sequence, **fields)
        self.sequence += 1
        return rendered

    # the stream's events, in order

    def opening(self) -> list[bytes]:
        self.status = "in_progress"
        at = {"output_index": 0}
        return [
            self.next("response.created", response=self.snapshot()),
            self.next("response.in_progress", response=self.snapshot()),
            self.next("response.output_item.added", item=self.item(False), **at),
            self.next(
                "response.content_part.added",
                item_id=self.item_id,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                **at,
            ),
        ]

    def delta(self, text: str) -> bytes:
        self.text += text
        return self.next(
            "response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0, delta=text, logprobs=[]
        )

    def finish(self, engine_finish: str | None) -> None:
        self.engine_finish = engine_finish
        self.status = "incomplete" if engine_finish in _INCOMPLETE else "completed"

    def closing(self, engine_finish: str | None) -> list[bytes]:
        self.finish(engine_finish)
        at = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        last = "response.incomplete" if self.status == "incomplete" else "response.completed"
        return [
            self.next("response.output_text.done", text=self.text, logprobs=[], **at),
            self.next("response.content_part.done", part=self.part(), **at),
            self.next("response.output_item.done", output_index=0, item=self.item(True)),
            self.next(last, response=self.snapshot()),
        ]

    def failed(self, code: str, message: str) -> bytes:
        self.status, self.error = "failed", {"code": code, "message": message}
        return self.next("response.failed", response=self.snapshot())

    def cancelled(self) -> None:
        if self.status in ("queued", "in_progress"):
            self.status = "cancelled"


def error_event(code: str, message: str) -> bytes:
    """A refusal after the stream's 200 went out (keep-alives had begun)."""
    return event("error", -1, code=code, message=message, param=None)
