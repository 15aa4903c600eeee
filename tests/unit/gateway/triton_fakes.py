"""Fakes for the Triton-protocol unit tests: engine responses carrying the
raw outputs the gateway re-renders (numpy arrays with the batch dimension,
what `tritonclient.grpc` hands the client library), shaped like
ensemble/outbound/public_outputs.py builds them, and scripts that answer as
the engine does for `stream: true` (deltas) and `stream: false` (one whole
answer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from client import StreamEvent
from contract.public_tensors import ensemble_output_name
from tests.unit.gateway.openai_fakes import HANG, Script

KEY = "k" * 32  # a well-formed request key, as the engine echoes it


def outputs(
    model: str, text: str, ids: tuple[int, ...] = (), finish: str = "", prompt: int = 5, key: str = KEY
) -> dict[str, np.ndarray]:
    return {
        "text_output": np.array([[text.encode()]], dtype=np.object_),
        "finish_reason": np.array([[finish.encode()]], dtype=np.object_),
        ensemble_output_name("request_key") if model == "ensemble" else "request_key": np.array(
            [[key.encode()]], dtype=np.object_
        ),
        "num_input_tokens": np.array([[prompt]], dtype=np.int32),
        "num_output_tokens": np.array([[len(ids)]], dtype=np.int32),
        "output_ids": np.array([list(ids)], dtype=np.int32),
        "cum_log_probs": np.zeros((1, 0), dtype=np.float32),
        "output_log_probs": np.zeros((1, 0, 0), dtype=np.float32),
        "arrival_time_ns": np.array([[0]], dtype=np.int64),
        "first_token_time_ns": np.array([[0]], dtype=np.int64),
        "last_token_time_ns": np.array([[0]], dtype=np.int64),
    }


def tev(
    model: str,
    text: str,
    ids: tuple[int, ...] = (),
    finish: str = "",
    final: bool = False,
    prompt: int = 5,
    key: str = KEY,
) -> StreamEvent:
    return StreamEvent(
        text=text,
        finish_reason=finish or None,
        num_input_tokens=prompt,
        num_output_tokens=len(ids),
        output_ids=ids,
        final=final,
        request_key=key,
        outputs=outputs(model, text, ids, finish, prompt, key),
    )


def engine(*texts: str, finish: str = "length", hang_after: int | None = None) -> Script:
    """Each text one token's delta when streaming; one whole answer when not.
    `hang_after`: the engine goes quiet after that many streamed responses."""

    def script(model: str, values: Mapping[str, Any], request_id: str) -> list[Any]:
        key = values["request_key"]  # the engine echoes the key it was sent
        if not values.get("stream"):
            ids = tuple(100 + i for i in range(len(texts)))
            return [tev(model, "".join(texts), ids, finish, final=True, key=key)]
        events: list[Any] = [tev(model, t, (100 + i,), key=key) for i, t in enumerate(texts)]
        last = events[-1]
        events[-1] = tev(model, last.text, last.output_ids, finish, final=True, key=key)
        if hang_after is not None:
            events = events[:hang_after] + [HANG]
        return events

    return script
