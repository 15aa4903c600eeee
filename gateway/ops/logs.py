"""Structured logs: one JSON object per line, each carrying the request's ids.

Every request gets the gateway's own id (`request_id`, also the response's
`id` stem and the stem of its Triton request ids), keeps the caller's
`x-request-id` (logged and echoed, never sent to Triton as an id) and a W3C
trace context: a valid incoming `traceparent` is continued under a new span
id, a missing or malformed one starts a new trace. Nothing at INFO holds
prompt or completion text, API keys or request keys; `user` is logged as a
SHA-256 prefix, enough to group one caller's requests."""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
# the caller's x-request-id is echoed in a header and logged: bound it to something printable
_CALLER_ID = re.compile(r"[\x21-\x7e]{1,128}")


@dataclass
class LogContext:
    request_id: str
    trace_id: str
    span_id: str
    trace_flags: str = "01"
    caller_request_id: str | None = None
    started_s: float = field(default_factory=time.perf_counter)
    # filled in by the handler, read by the access log and the metrics
    route: str = ""
    tier: str = "-"
    key_id: str = "-"
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.trace_flags}"


_current: contextvars.ContextVar[LogContext | None] = contextvars.ContextVar("gateway_request", default=None)


def current() -> LogContext | None:
    return _current.get()


def bind(context: LogContext) -> contextvars.Token[LogContext | None]:
    return _current.set(context)


def unbind(token: contextvars.Token[LogContext | None]) -> None:
    _current.reset(token)


def new_request_id() -> str:
    return secrets.token_hex(12)


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """(trace id, flags) of a valid version-00 traceparent, else None."""
    if not value:
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower())
    if match is None or match.group(1) == _ZERO_TRACE or match.group(2) == _ZERO_SPAN:
        return None
    return match.group(1), match.group(3)


def new_context(caller_request_id: str | None, traceparent: str | None) -> LogContext:
    parsed = parse_traceparent(traceparent)
    trace_id, flags = parsed if parsed else (secrets.token_hex(16), "01")
    caller = caller_request_id if caller_request_id and _CALLER_ID.fullmatch(caller_request_id) else None
    return LogContext(
        request_id=new_request_id(),
        trace_id=trace_id,
        span_id=secrets.token_hex(8),
        trace_flags=flags,
        caller_request_id=caller,
    )


def hashed(value: str | None) -> str | None:
    """A stable, non-reversible id for a caller-supplied identity (`user`)."""
    if not value:
        return None
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = current()
        if context is not None:
            entry["request_id"] = context.request_id
            entry["trace_id"] = context.trace_id
            if context.caller_request_id:
                entry["x_request_id"] = context.caller_request_id
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            entry.update(extra)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO, and the gateway's own metrics scrapes
    # of each replica run several times a second: they would bury the access
    # log (at DEBUG they are kept)
    quiet = max(logging.WARNING, root.level) if root.level > logging.DEBUG else logging.DEBUG
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(quiet)
