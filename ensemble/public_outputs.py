"""The public output tensors (interface.md) of one response, shared by the
`postprocessing` adapter and `llm_bls`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LLMResponse:
    """One response of the LLM step, as plain values."""
    token_ids: list[int]
    sequence_length: int
    finish_reason: str | None
    num_input_tokens: int = 0
    cum_log_probs: np.ndarray | None = None
    output_log_probs: np.ndarray | None = None
    times_ns: tuple[int, int, int] | None = None   # arrival, first token, last token


@dataclass(frozen=True)
class ReturnFlags:
    log_probs: bool = False
    perf_metrics: bool = False
    output_ids: bool = False


def public_output_arrays(text: str, finish_reason: str | None, llm: LLMResponse,
                         flags: ReturnFlags, request_key: str) -> dict[str, np.ndarray]:
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
        "cum_log_probs": (np.asarray(llm.cum_log_probs, dtype=np.float32).reshape(1, -1) if want_lp
                          else np.zeros((1, 0), dtype=np.float32)),
        "output_log_probs": (np.asarray(llm.output_log_probs, dtype=np.float32).reshape(1, 1, -1)
                             if want_lp and llm.output_log_probs is not None
                             else np.zeros((1, 0, 0), dtype=np.float32)),
        "arrival_time_ns": np.asarray([[times[0]]], dtype=np.int64),
        "first_token_time_ns": np.asarray([[times[1]]], dtype=np.int64),
        "last_token_time_ns": np.asarray([[times[2]]], dtype=np.int64),
    }
