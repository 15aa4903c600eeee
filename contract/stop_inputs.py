"""The `stop` request to the LLM step, as the text stages send it: by the
request key (the LLM step refuses a stop by request id alone)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def stop_inputs(request_key: str) -> dict[str, npt.NDArray[Any]]:
    """Inputs of a stop for the request with this key (batch dimension first).
    The text stages and the client library both send exactly this; `input_ids`,
    `input_lengths` and `request_output_len` because TensorRT-LLM's step declares
    them required."""
    return {
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": np.ones((1, 1), dtype=np.int32),
        "request_output_len": np.ones((1, 1), dtype=np.int32),
        "stop": np.ones((1, 1), dtype=np.bool_),
        "request_key": np.asarray([[request_key.encode()]], dtype=np.object_),
    }
