"""Engine-side state of one request.

A Request is exactly one generated sequence: its tokens, its KV progress and
its timing. Only the engine loop thread mutates a Request after it is queued.
"""

from __future__ import annotations

import enum
import sys
import time
from collections.abc import Callable
from typing import Any

from .sampling_params import SamplingParams


class FinishReason(str, enum.Enum):  # noqa: UP042 (StrEnum would change str() and format() of a member)
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    ERROR = "error"


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_CANCELLED = enum.auto()
    FINISHED_TIMEOUT = enum.auto()
    FINISHED_ERROR = enum.auto()


FINISHED_STATUS: dict[FinishReason, RequestStatus] = {
    FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
    FinishReason.CANCELLED: RequestStatus.FINISHED_CANCELLED,
    FinishReason.TIMEOUT: RequestStatus.FINISHED_TIMEOUT,
    FinishReason.ERROR: RequestStatus.FINISHED_ERROR,
}

OutputCallback = Callable[[Any], None]  # receives a RequestOutput


class Request:
    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "sampling",
        "priority",
        "status",
        "all_token_ids",
        "output_token_ids",
        "output_logprobs",
        "cum_log_prob",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_hashes",
        "arrival_time_ns",
        "first_token_time_ns",
        "last_token_time_ns",
        "token_timeout_ns",
        "deadline_mono_ns",
        "admit_seq",
        "finish_reason",
        "error",
        "num_returned_tokens",
        "on_output",
        "stop_token_ids",
        "max_tokens",
        "has_stop_words",
        "num_continuation_tokens",
        "slice_tokens",
        "slice_layers_done",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        priority: int = 0,
        token_timeout_ms: int = 0,
        on_output: OutputCallback | None = None,
        arrival_time_ns: int | None = None,
        continuation_ids: list[int] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling = sampling
        self.priority = priority
        self.status = RequestStatus.WAITING
        # A continuation (output another replica generated before it died) is
        # output already generated: max_tokens, min_tokens, penalties and stop
        # words see it, the first prefill covers it exactly like a preempted
        # request's re-prefill, and it is never returned (num_returned_tokens,
        # the log-probs and cum_log_prob count new tokens only).
        continuation = list(continuation_ids or ())
        self.num_continuation_tokens = len(continuation)
        # prompt + generated: what a (re-)prefill after preemption feeds, and
        # what block hashes cover
        self.all_token_ids: list[int] = list(prompt_token_ids) + continuation
        self.output_token_ids: list[int] = continuation
        self.output_logprobs: list[float] | None = [] if sampling.return_log_probs else None
        self.cum_log_prob: float | None = 0.0 if sampling.return_log_probs else None
        self.num_computed_tokens = 0  # tokens whose K/V are in this request's blocks
        self.num_cached_tokens = 0  # prompt tokens the prefix cache served at first admission
        self.block_hashes: list[Any] = []  # hashes of full blocks of all_token_ids (block_pool.BlockHash)
        self.arrival_time_ns = arrival_time_ns if arrival_time_ns is not None else time.time_ns()
        self.first_token_time_ns: int | None = None
        self.last_token_time_ns: int | None = None
        # per-token timeout on the monotonic clock; 0 = off
        self.token_timeout_ns = token_timeout_ms * 1_000_000
        self.deadline_mono_ns = time.monotonic_ns() + self.token_timeout_ns if token_timeout_ms else 0
        self.admit_seq = 0  # order of (re-)admission; preemption picks the latest
        # a chunk in flight by layer slices (LayerSlice): its tokens from
        # num_computed_tokens (0 = none) and the layers it has run
        self.slice_tokens = 0
        self.slice_layers_done = 0
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        self.num_returned_tokens = 0  # output tokens handed out (the ending EOS is not)
        self.on_output = on_output
        # read by the scheduler for every token: kept here, in slots, so the
        # common step does not touch the SamplingParams (a dict-backed object)
        # None here only when built outside the engine, which fills in the EOS ids
        self.stop_token_ids = frozenset(sampling.stop_token_ids or ())
        # filled in by the engine when the request left it None; built outside
        # the engine without one, only max_model_len limits the request
        self.max_tokens: int = sys.maxsize if sampling.max_tokens is None else sampling.max_tokens
        self.has_stop_words = bool(sampling.stop_words_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated output, a continuation included."""
        return len(self.output_token_ids)

    @property
    def num_new_output_tokens(self) -> int:
        """Output generated by this request itself (after its continuation)."""
        return len(self.output_token_ids) - self.num_continuation_tokens

    def append_output_token(self, token_id: int, logprob: float | None) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.output_logprobs is not None:
            lp = 0.0 if logprob is None else logprob
            self.output_logprobs.append(lp)
            self.cum_log_prob = (self.cum_log_prob or 0.0) + lp

    def __repr__(self) -> str:  # no token ids: they may hold prompt text
        return (
            f"Request(id={self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
            f"output={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
