"""One engine response (the client library's `StreamEvent.outputs`: the raw
outputs, numpy arrays with the batch dimension, as the gateway's gRPC
upstream received them) rendered in the caller's format, as Triton 2.51 would
have answered it directly:

- generate JSON: `{"model_name", "model_version": "1", "id" (only when the
  caller sent one), <output>: value}`, a one-element tensor as a scalar,
  anything else as a flat list, BYTES decoded as UTF-8;
- KServe v2 JSON infer: `{"model_name", "model_version", "id", "outputs":
  [{"name", "datatype", "shape", "data"}]}`, or binary (`binary_data_size`)
  for the outputs asked for so;
- KServe v2 protobuf `ModelInferResponse`: every output in
  `raw_output_contents`, and on stream responses `triton_final_response`, as
  Triton sets it for decoupled models.

`ensemble` names its key output `request_key_out` (a Triton ensemble cannot
have an input and an output of one name), `llm_bls` `request_key`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import np_to_triton_dtype

from contract.public_tensors import PUBLIC_OUTPUTS, ensemble_output_name

from ..bodies.strict_json import shown
from .inputs import ValidatedCall, input_error
from .raw import encode_raw

MODEL_VERSION = "1"
FINAL_FLAG = "triton_final_response"
# Triton 2.51's ensemble scheduler puts these parameters on every response
# (generate renders them as top-level keys); for a request outside a sequence
# they always have these values. The client library keeps only the outputs,
# so they are restored here.
RESPONSE_PARAMETERS: dict[str, dict[str, bool | int]] = {
    "ensemble": {"sequence_end": False, "sequence_id": 0, "sequence_start": False}
}


def output_names(model: str) -> list[str]:
    """The public outputs of `model`, by the names it answers with."""
    return [ensemble_output_name(spec.name) if model == "ensemble" else spec.name for spec in PUBLIC_OUTPUTS]


def check_requested(model: str, requested: Sequence[str] | None) -> None:
    """A 400 naming the first requested output the model does not have."""
    if not requested:
        return
    known = output_names(model)
    for name in requested:
        if name not in known:
            raise input_error(shown(name), f"unknown output of {model}; the outputs are {', '.join(known)}")


def visible(
    call: ValidatedCall, outputs: Mapping[str, Any], requested: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """The outputs the caller gets: output ids emptied unless it asked for
    them (the gateway asks for them always, to count the completion tokens),
    only the requested ones when it named some (in its order)."""
    arrays = {name: np.asarray(value) for name, value in outputs.items()}
    ids = arrays.get("output_ids")
    if ids is not None and not call.return_output_ids:
        # what the model answers when they are not asked for: the same rank, no ids
        arrays["output_ids"] = np.zeros(ids.shape[:-1] + (0,), dtype=ids.dtype) if ids.ndim else ids[:0]
    if requested:
        return {name: arrays[name] for name in requested if name in arrays}
    return arrays


def datatype_of(array: np.ndarray) -> str:
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        return "BYTES"
    return np_to_triton_dtype(array.dtype)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def flat_values(array: np.ndarray) -> list[Any]:
    return [_plain(v) for v in array.reshape(-1).tolist()]


def json_value(array: np.ndarray) -> Any:
    """generate's rendering: one element as a scalar, anything else a flat list."""
    values = flat_values(array)
    return values[0] if len(values) == 1 else values


def generate_json(model: str, outputs: Mapping[str, np.ndarray], caller_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if caller_id:
        body["id"] = caller_id
    body.update(RESPONSE_PARAMETERS.get(model, {}))
    body.update((name, json_value(array)) for name, array in outputs.items())
    return body


def infer_json(
    model: str,
    outputs: Mapping[str, np.ndarray],
    caller_id: str | None,
    binary: set[str] | frozenset[str] = frozenset(),
) -> tuple[dict[str, Any], bytes]:
    """(the JSON header, the binary part): the outputs named in `binary`
    travel as raw bytes after the JSON (`binary_data_size`)."""
    body: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if caller_id:
        body["id"] = caller_id
    if model in RESPONSE_PARAMETERS:
        body["parameters"] = dict(RESPONSE_PARAMETERS[model])
    rendered, chunks = [], []
    for name, array in outputs.items():
        tensor: dict[str, Any] = {"name": name, "datatype": datatype_of(array), "shape": list(array.shape)}
        if name in binary:
            chunk = encode_raw(array)
            tensor["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            tensor["data"] = flat_values(array)
        rendered.append(tensor)
    body["outputs"] = rendered
    return body, b"".join(chunks)


def infer_proto(
    model: str, outputs: Mapping[str, np.ndarray], caller_id: str | None, final: bool | None = None
) -> service_pb2.ModelInferResponse:
    """`final`: on stream responses, the `triton_final_response` parameter
    (every response of a decoupled model carries it); None leaves it out."""
    response = service_pb2.ModelInferResponse(model_name=model, model_version=MODEL_VERSION, id=caller_id or "")
    for name, array in outputs.items():
        response.outputs.add(name=name, datatype=datatype_of(array), shape=list(array.shape))
        response.raw_output_contents.append(encode_raw(array))
    for name, value in RESPONSE_PARAMETERS.get(model, {}).items():
        if isinstance(value, bool):
            response.parameters[name].bool_param = value
        else:
            response.parameters[name].int64_param = value
    if final is not None:
        response.parameters[FINAL_FLAG].bool_param = final
    return response
