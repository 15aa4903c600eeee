"""Wire formats: public inputs as generate JSON or gRPC tensors, and responses
(SSE JSON or gRPC outputs) back into `StreamEvent`s.

Pure functions with no I/O, shared by the async client and the Locust users.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from contract.stop_inputs import stop_inputs

from .types import GenerationOptions, StreamEvent

# Triton datatypes of the public inputs (interface.md)
INPUT_DATATYPES: dict[str, str] = {
    "max_tokens": "INT32",
    "end_id": "INT32",
    "pad_id": "INT32",
    "top_k": "INT32",
    "min_tokens": "INT32",
    "priority": "INT32",
    "token_timeout_ms": "INT32",
    "continuation_ids": "INT32",
    "top_p": "FP32",
    "temperature": "FP32",
    "repetition_penalty": "FP32",
    "presence_penalty": "FP32",
    "frequency_penalty": "FP32",
    "length_penalty": "FP32",
    "seed": "UINT64",
    "stream": "BOOL",
    "ignore_eos": "BOOL",
    "exclude_input_in_output": "BOOL",
    "return_output_ids": "BOOL",
    "return_log_probs": "BOOL",
    "return_perf_metrics": "BOOL",
    "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL",
    "text_input": "BYTES",
    "messages": "BYTES",
    "segment": "BYTES",
    "stop_words": "BYTES",
    "bad_words": "BYTES",
    "request_key": "BYTES",
}
# inputs of dims [-1]: sent as shape [1, n], every other input as [1, 1]
LIST_INPUTS = frozenset({"stop_words", "bad_words", "continuation_ids"})
_NUMPY_TYPES = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_, "BYTES": np.object_}
_PERF_OUTPUTS = ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns")
_NOT_INPUTS = frozenset({"request_id"})


def input_values(text_input: str, options: GenerationOptions, stream: bool = True) -> dict[str, Any]:
    """The public inputs to send, as plain Python values (None = not sent)."""
    if not isinstance(text_input, str):
        raise TypeError(f"text_input must be a str (got {type(text_input).__name__})")
    if not text_input and not options.messages:
        raise ValueError("text_input must not be empty unless messages are given")
    values: dict[str, Any] = {"text_input": text_input, "stream": stream}
    for f in fields(options):
        value = getattr(options, f.name)
        if value is None or f.name in _NOT_INPUTS:
            continue
        if f.name == "continuation_ids" and not value:
            continue  # nothing generated yet: a plain request
        if f.name == "messages":
            value = json.dumps(value, ensure_ascii=False)
        values[f.name] = value
    return values


def generate_body(values: Mapping[str, Any], request_id: str) -> dict[str, Any]:
    """JSON body for `generate` / `generate_stream`; `id` is the Triton request id."""
    body = dict(values)
    body["id"] = request_id
    return body


def grpc_tensors(values: Mapping[str, Any]) -> list[tuple[str, str, np.ndarray[Any, Any]]]:
    """(name, datatype, array) per input, batch dim first: [1, 1] scalars, [1, n] lists."""
    tensors = []
    for name, value in values.items():
        datatype = INPUT_DATATYPES.get(name)
        if datatype is None:
            raise ValueError(f"unknown input {name!r}")
        items = list(value) if name in LIST_INPUTS else [value]
        if datatype == "BYTES":
            items = [str(item).encode("utf-8") for item in items]
        tensors.append((name, datatype, np.array([items], dtype=_NUMPY_TYPES[datatype])))
    return tensors


def stop_values(request_key: str) -> dict[str, tuple[str, np.ndarray[Any, Any]]]:
    """Inputs of the `stop` request to the LLM step, with their Triton
    datatypes: the one stop request of the stack (contract/stop_inputs.py); the
    server stops by key, never by request id alone."""
    return {name: (np_to_triton_dtype(array.dtype), array) for name, array in stop_inputs(request_key).items()}


def stop_generate_body(request_id: str, request_key: str) -> dict[str, Any]:
    """The stop request as a flat `generate` body: Triton's `infer` endpoints
    refuse decoupled models, so HTTP stops go through `generate`. `id` only
    names the stop in the server's logs; `request_key` is what selects the request."""
    body: dict[str, Any] = {name: array.reshape(-1).tolist() for name, (_, array) in stop_values(request_key).items()}
    # Scalars the way the generate endpoint takes them: a bool and a plain string.
    body["stop"] = True
    body["request_key"] = request_key
    body["id"] = request_id
    return body


def event_from_outputs(outputs: Mapping[str, Any], received_s: float, final: bool = False) -> StreamEvent:
    """Build an event from one response's outputs, from JSON (scalars or lists)
    or from gRPC (numpy arrays with a batch dim) alike."""
    finish = _text(outputs.get("finish_reason")) or None
    return StreamEvent(
        text=_text(outputs.get("text_output")),
        finish_reason=finish,
        num_input_tokens=_int(outputs.get("num_input_tokens")),
        num_output_tokens=_int(outputs.get("num_output_tokens")),
        output_ids=tuple(int(v) for v in _flat(outputs.get("output_ids"))),
        cum_log_probs=_floats(outputs.get("cum_log_probs")),
        output_log_probs=_nested_floats(outputs.get("output_log_probs")),
        perf_ns={name: int(_flat(outputs[name])[0]) for name in _PERF_OUTPUTS if _flat(outputs.get(name))},
        final=final,
        received_s=received_s,
        # `ensemble` echoes it as request_key_out (a Triton ensemble cannot have an
        # input and an output of one name), `llm_bls` as request_key
        request_key=_text(outputs.get("request_key") or outputs.get("request_key_out")) or None,
        outputs=dict(outputs),
    )


def _flat(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, np.ndarray):
        flat: list[Any] = value.reshape(-1).tolist()
        return flat
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for item in value:
            out.extend(_flat(item))
        return out
    return [value]


def _text(value: Any) -> str:
    parts = _flat(value)
    return "".join(p.decode("utf-8", errors="replace") if isinstance(p, bytes) else str(p) for p in parts)


def _int(value: Any) -> int | None:
    items = _flat(value)
    return int(items[0]) if items else None


def _floats(value: Any) -> tuple[float, ...] | None:
    items = _flat(value)
    return tuple(float(v) for v in items) if items else None


def _nested_floats(value: Any) -> tuple[tuple[float, ...], ...] | None:
    if value is None:
        return None
    array = np.asarray(value, dtype=np.float64)
    if array.size == 0:
        return None
    rows = array.reshape(-1, array.shape[-1]) if array.ndim >= 1 else array.reshape(1, 1)
    return tuple(tuple(float(v) for v in row) for row in rows)
