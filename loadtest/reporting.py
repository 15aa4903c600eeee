"""Turns one stream's outcome into Locust entries and a per-stream sample line.

Entries per request type ("SSE", "gRPC"): `ttft`, `itl` (one sample per gap),
`tpot`, `e2e` (response_length = output tokens, so the CSV's average content
size x count is the token total), `cancelled`. An error is a failed `e2e`.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from client.timing import compute_tpot

from .streams import StreamOutcome
from .tokens import TokenCounter


def _ms(seconds: float) -> float:
    return seconds * 1000.0


class StreamError(Exception):
    """What Locust records as the failure of an `e2e` entry."""


class SampleLog:
    """Appends one JSON line per stream; the plots read it back."""

    def __init__(self, path: str | Path | None) -> None:
        self._file: TextIO | None = open(path, "a", encoding="utf-8") if path else None
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        with self._lock:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def report_outcome(events: Any, outcome: StreamOutcome, counter: TokenCounter, samples: SampleLog) -> dict[str, Any]:
    """Fire the Locust entries for one stream; returns the sample record."""
    kind = outcome.request_type
    output_tokens = counter.count(outcome.text)
    tpot = compute_tpot(outcome.e2e_s, outcome.ttft_s, output_tokens)

    def fire(name: str, seconds: float, length: int = 0, exception: Exception | None = None) -> None:
        events.request.fire(
            request_type=kind,
            name=name,
            response_time=_ms(seconds),
            response_length=length,
            exception=exception,
            context={"request_id": outcome.request_id},
        )

    if outcome.ttft_s is not None:
        fire("ttft", outcome.ttft_s)
    for gap in outcome.itl_s:
        fire("itl", gap)
    if outcome.error is not None:
        fire("e2e", outcome.e2e_s, output_tokens, StreamError(outcome.error[:300]))
    elif outcome.cancelled:
        fire("cancelled", outcome.e2e_s, output_tokens)
    else:
        if tpot is not None:
            fire("tpot", tpot)
        fire("e2e", outcome.e2e_s, output_tokens)
    record = {
        "type": kind,
        "request_id": outcome.request_id,
        "end_unix_s": time.time(),
        "ttft_ms": None if outcome.ttft_s is None else _ms(outcome.ttft_s),
        "itl_ms": [_ms(g) for g in outcome.itl_s],
        "tpot_ms": None if tpot is None else _ms(tpot),
        "e2e_ms": _ms(outcome.e2e_s),
        "output_tokens": output_tokens,
        "responses_with_tokens": len(outcome.token_times_s),
        "server_output_tokens": outcome.server_output_tokens,
        "finish_reason": outcome.finish_reason,
        "cancelled": outcome.cancelled,
        "error": outcome.error,
    }
    samples.write(record)
    return record
