"""Engine outputs → the LLM step's output arrays: TensorRT-LLM names and
shapes (batch, then beam), plus this project's timing and context outputs."""

from __future__ import annotations

import numpy as np

from .engine.core.outputs import RequestOutput


def output_arrays(
    out: RequestOutput, token_ids: list[int], logprobs: list[float] | None, context: bytes, request_key: str
) -> dict[str, np.ndarray]:
    """`token_ids` are the ids this response carries (the delta when streaming,
    everything otherwise). Every array has a leading batch dimension of 1. The
    request key is echoed so a direct caller that sent none learns the minted one."""
    return {
        "output_ids": np.asarray([[token_ids]], dtype=np.int32),  # [1, beam, tokens]
        "sequence_length": np.asarray([[out.num_output_tokens]], dtype=np.int32),  # [1, beam]
        "cum_log_probs": np.asarray([[out.cum_log_prob or 0.0]], dtype=np.float32),
        "output_log_probs": np.asarray([[logprobs if logprobs is not None else []]], dtype=np.float32),
        "finish_reason": np.asarray([[(out.finish_reason or "").encode()]], dtype=np.object_),
        "num_input_tokens": np.asarray([[out.num_prompt_tokens]], dtype=np.int32),
        "arrival_time_ns": np.asarray([[out.arrival_time_ns or 0]], dtype=np.int64),
        "first_token_time_ns": np.asarray([[out.first_token_time_ns or 0]], dtype=np.int64),
        "last_token_time_ns": np.asarray([[out.last_token_time_ns or 0]], dtype=np.int64),
        "request_context": np.asarray([[context]], dtype=np.object_),
        "request_key": np.asarray([[request_key.encode()]], dtype=np.object_),
    }
