"""One response of the LLM step read into plain values, and the public output
tensors (docs/interface.md) built from it; shared by the `postprocessing`
adapter and `llm_bls`, so both read and answer a response the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.errors import InvalidInputError, decode_utf8_field

from ..request_context import RequestContext

# an array getter: tensor name -> numpy array, or None when the tensor is absent
ArrayGetter = Callable[[str], "np.ndarray | None"]

# The LLM step's outputs the text stages read: what `llm_bls` asks for, and
# what `llm_response_from` parses.
LLM_RESPONSE_OUTPUTS: tuple[str, ...] = (
    "output_ids",
    "sequence_length",
    "finish_reason",
    "num_input_tokens",
    "cum_log_probs",
    "output_log_probs",
    "arrival_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
)
_TIMES = ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns")


@dataclass
class LLMResponse:
    """One response of the LLM step, as plain values."""

    token_ids: list[int]
    sequence_length: int
    finish_reason: str | None
    num_input_tokens: int = 0
    cum_log_probs: np.ndarray | None = None
    output_log_probs: np.ndarray | None = None
    times_ns: tuple[int, int, int] | None = None  # arrival, first token, last token


def llm_response_from(get: ArrayGetter) -> LLMResponse:
    """One response of the LLM step, from its output tensors (`llm_bls` reads a
    BLS response, `postprocessing` the inputs the ensemble wires to it).

    Arrays come with the batch dimension and, for the token ids, the beam one
    ([1, 1, N]); only one sequence per response exists, so any other shape is
    refused rather than its beams run together. An absent optional output
    reads as its zero value."""
    arrival, first_token, last_token = (int(_first(get, name) or 0) for name in _TIMES)
    return LLMResponse(
        token_ids=_token_ids(get("output_ids")),
        sequence_length=int(_first(get, "sequence_length") or 0),
        finish_reason=_finish_reason(_first(get, "finish_reason")),
        num_input_tokens=int(_first(get, "num_input_tokens") or 0),
        cum_log_probs=get("cum_log_probs"),
        output_log_probs=get("output_log_probs"),
        times_ns=(arrival, first_token, last_token),
    )


def _first(get: ArrayGetter, name: str) -> Any:
    """The tensor's first element (numpy scalar or bytes), None when absent or empty."""
    array = get(name)
    if array is None or np.asarray(array).size == 0:
        return None
    return np.asarray(array).reshape(-1)[0]


def _token_ids(array: np.ndarray | None) -> list[int]:
    if array is None:
        return []
    values = np.asarray(array)
    if values.ndim > 1 and int(np.prod(values.shape[:-1])) != 1:
        raise InvalidInputError("output_ids", f"one sequence per response expected, got shape {list(values.shape)}")
    return values.reshape(-1).tolist()


def _finish_reason(value: Any) -> str | None:
    """STRING tensors hold bytes from Triton and str from a numpy test double;
    an empty reason means the response is not the last one."""
    if value is None:
        return None
    text = decode_utf8_field("finish_reason", value) if isinstance(value, (bytes, str)) else str(value)
    return text or None


@dataclass(frozen=True)
class ReturnFlags:
    log_probs: bool = False
    perf_metrics: bool = False
    output_ids: bool = False

    @classmethod
    def of(cls, context: RequestContext) -> ReturnFlags:
        """The request's `return_*` inputs, as preprocessing packed them."""
        return cls(
            log_probs=context.return_log_probs,
            perf_metrics=context.return_perf_metrics,
            output_ids=context.return_output_ids,
        )


def public_output_arrays(
    text: str, finish_reason: str | None, llm: LLMResponse, flags: ReturnFlags, request_key: str
) -> dict[str, np.ndarray]:
    """Arrays with the batch dimension; what is not asked for is empty/zero.
    Every response carries the request key, so a caller that let the server
    mint it can still stop the request."""
    times = llm.times_ns if flags.perf_metrics and llm.times_ns else (0, 0, 0)
    want_lp = flags.log_probs and llm.cum_log_probs is not None
    return {
        "text_output": np.asarray([[text.encode()]], dtype=np.object_),
        "finish_reason": np.asarray([[(finish_reason or "").encode()]], dtype=np.object_),
        "request_key": np.asarray([[request_key.encode()]], dtype=np.object_),
        "num_input_tokens": np.asarray([[llm.num_input_tokens]], dtype=np.int32),
        "num_output_tokens": np.asarray([[len(llm.token_ids)]], dtype=np.int32),
        "output_ids": np.asarray([llm.token_ids if flags.output_ids else []], dtype=np.int32),
        "cum_log_probs": (
            np.asarray(llm.cum_log_probs, dtype=np.float32).reshape(1, -1)
            if want_lp
            else np.zeros((1, 0), dtype=np.float32)
        ),
        "output_log_probs": (
            np.asarray(llm.output_log_probs, dtype=np.float32).reshape(1, 1, -1)
            if want_lp and llm.output_log_probs is not None
            else np.zeros((1, 0, 0), dtype=np.float32)
        ),
        "arrival_time_ns": np.asarray([[times[0]]], dtype=np.int64),
        "first_token_time_ns": np.asarray([[times[1]]], dtype=np.int64),
        "last_token_time_ns": np.asarray([[times[2]]], dtype=np.int64),
    }
