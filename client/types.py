"""Typed request options, stream events and the final result."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.public_bounds import BOUNDS, bound_problem, validate_words
from contract.request_key import parse_request_key

from .timing import Timings

SEGMENTS = ("token", "sentence", "paragraph")
FINISH_REASONS = ("stop", "length", "cancelled", "timeout", "error", "content_filter")


def new_request_id() -> str:
    """The Triton request id: names the request in logs, not a credential."""
    return uuid.uuid4().hex


def check_request_key(key: object) -> str:
    """Return `key` if it is a well-formed request key, the credential that stops
    a request (contract/request_key.py defines the format the server checks), else raise ValueError naming
    `request_key`. The message never repeats the value: a key is a secret, and errors end up in logs."""
    if not isinstance(key, str):
        raise ValueError(f"request_key: must be a str (got {type(key).__name__})")
    parsed = parse_request_key(key)  # InvalidInputError is a ValueError
    if parsed is None:
        raise ValueError("request_key: must not be empty")
    return parsed


@dataclass
class GenerationOptions:
    """Mirrors the public inputs of `ensemble` / `llm_bls` (interface.md).

    None means "not sent": the server's default applies. `messages` is a Python
    list of {"role", "content"} dicts; the library JSON-encodes it.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    stop_words: list[str] | None = None
    bad_words: list[str] | None = None
    messages: list[dict[str, str]] | None = None
    end_id: int | None = None
    pad_id: int | None = None
    ignore_eos: bool | None = None
    exclude_input_in_output: bool | None = None
    segment: str | None = None
    priority: int | None = None
    token_timeout_ms: int | None = None
    return_output_ids: bool | None = None
    return_log_probs: bool | None = None
    return_perf_metrics: bool | None = None
    # Token counts are cheap and make TPOT exact, so they are asked for by default.
    return_num_input_tokens: bool | None = True
    return_num_output_tokens: bool | None = True
    # Output ids another replica already generated for this request (a stream
    # migrated after its replica died): the server continues after them, and
    # they count toward max_tokens, min_tokens, penalties and stop words;
    # only new tokens come back.
    continuation_ids: list[int] | None = None
    request_id: str | None = None
    # The stop credential; None = the client mints one per request. Kept out of
    # repr() so that logging the options cannot leak it.
    request_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # the server's own value rules (contract/public_bounds.py), refused here before sending
        for name in BOUNDS:
            problem = bound_problem(name, getattr(self, name, None))
            if problem is not None:
                raise ValueError(f"{name}: {problem}")
        if self.segment is not None and self.segment not in SEGMENTS:
            raise ValueError(f"segment must be one of {SEGMENTS} (got {self.segment!r})")
        for name in ("stop_words", "bad_words"):
            validate_words(name, getattr(self, name))  # InvalidInputError is a ValueError
        if self.messages is not None:
            _check_messages(self.messages)
        if self.continuation_ids is not None and (
            isinstance(self.continuation_ids, (str, bytes))
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in self.continuation_ids)
        ):
            raise ValueError("continuation_ids must be a list of token ids (integers in [0, 2**31))")
        if self.request_id is not None and not self.request_id:
            raise ValueError("request_id must not be empty")
        if self.request_key is not None:
            check_request_key(self.request_key)


def _check_messages(messages: list[dict[str, str]]) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for index, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(f"messages[{index}] must be a dict with string 'role' and 'content'")


@dataclass(frozen=True)
class StreamEvent:
    """One response of a stream: a text delta and whatever came with it."""

    text: str
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    output_ids: tuple[int, ...] = ()
    cum_log_probs: tuple[float, ...] | None = None
    output_log_probs: tuple[tuple[float, ...], ...] | None = None
    perf_ns: dict[str, int] = field(default_factory=dict)  # arrival/first/last token times, server clock
    final: bool = False
    received_s: float = 0.0  # client clock (time.perf_counter)
    # The `request_key` output the server echoes on every response; a secret, so not in repr().
    request_key: str | None = field(default=None, repr=False)
    # Every output of the response as the server sent it (numpy arrays over
    # gRPC, JSON values over SSE): what a proxy re-renders in Triton's own
    # formats. Not in repr() (it holds the request key) nor in equality.
    outputs: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def carries_tokens(self) -> bool:
        return bool(self.text) or bool(self.output_ids)


@dataclass
class GenerationResult:
    """The whole answer of one request plus client-side timings."""

    request_id: str
    model: str
    transport: str
    timings: Timings
    text: str = ""
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int = 0  # sum of the per-delta counts (or of output_ids)
    output_ids: list[int] = field(default_factory=list)
    num_responses: int = 0
    error: str | None = None
    attempts: int = 1
    resumes: int = 0  # reconnections of a dropped SSE stream through the gateway
    # The key that stops this request (sent, or echoed by the server); a secret:
    # not in repr() and not in to_dict().
    request_key: str = field(default="", repr=False)

    def add(self, event: StreamEvent) -> None:
        self.text += event.text
        self.num_responses += 1
        self.output_ids.extend(event.output_ids)
        if event.num_output_tokens is not None:
            self.num_output_tokens += event.num_output_tokens
        elif event.output_ids:
            self.num_output_tokens += len(event.output_ids)
        if event.num_input_tokens is not None:
            self.num_input_tokens = event.num_input_tokens
        if event.finish_reason:
            self.finish_reason = event.finish_reason
        self.timings.record_response(event.received_s, event.carries_tokens)

    @property
    def ttft_s(self) -> float | None:
        return self.timings.ttft_s

    @property
    def e2e_s(self) -> float | None:
        return self.timings.e2e_s

    @property
    def itl_s(self) -> list[float]:
        return self.timings.itl_s

    @property
    def tpot_s(self) -> float | None:
        return self.timings.tpot_s(self.num_output_tokens)

    def to_dict(self) -> dict[str, Any]:
        # No `request_key` here on purpose: it is the credential that stops the
        # request, and this dict is printed (`generate --json`) and logged.
        return {
            "request_id": self.request_id,
            "model": self.model,
            "transport": self.transport,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "num_input_tokens": self.num_input_tokens,
            "num_output_tokens": self.num_output_tokens,
            "output_ids": self.output_ids or None,
            "num_responses": self.num_responses,
            "attempts": self.attempts,
            "resumes": self.resumes,
            "ttft_ms": _ms(self.ttft_s),
            "tpot_ms": _ms(self.tpot_s),
            "e2e_ms": _ms(self.e2e_s),
            "itl_ms": [round(g * 1000, 3) for g in self.itl_s],
            "chunk_gaps_ms": [round(g * 1000, 3) for g in self.timings.chunk_gaps_s],
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
