"""Triton's two JSON request bodies as `WireInput`s for the one validator:

- generate / generate_stream: a flat object, one key per input (a JSON value
  or a flat list), plus `id`. Triton converts JSON values to the model's
  datatypes itself, so the datatype is the spec's and inputs.py checks the
  values' JSON types.
- KServe v2 infer: `{"id", "parameters", "inputs": [{"name", "datatype",
  "shape", "data"}], "outputs": [{"name", "parameters"}]}`, with the
  binary-data extension (`Inference-Header-Content-Length` splits the body;
  an input's `binary_data_size` takes its raw bytes, in input order), which is
  what `tritonclient.http` sends by default."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bodies.strict_json import shown
from ..core.errors import GatewayError
from .inputs import SPECS, Values, WireInput, caller_id, input_error, wire_datatype
from .raw import decode_raw

_INFER_KEYS = frozenset({"id", "parameters", "inputs", "outputs"})
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


def body_error(what: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, what, param=param)


def generate_inputs(body: Mapping[str, Any]) -> tuple[list[WireInput], str | None]:
    """A generate body's inputs and the caller's `id`."""
    items: list[WireInput] = []
    for name, value in body.items():
        if name == "id":
            continue
        spec = SPECS.get(name)
        datatype = wire_datatype(spec) if spec is not None else "?"
        values = value if isinstance(value, list) else [value]
        items.append(WireInput(name, datatype, (len(values),), _flat_only(values)))
    return items, caller_id(body.get("id"))


def _flat_only(values: list[Any]) -> Values:
    def decode() -> Sequence[Any]:
        if any(isinstance(v, (list, dict)) for v in values):
            raise ValueError("must be a value or a flat list of values")
        return values

    return decode


@dataclass
class InferBody:
    """A KServe v2 JSON infer request, decoded."""

    inputs: list[WireInput]
    caller_id: str | None
    requested: list[str] | None = None  # the outputs asked for; None: all
    binary_outputs: set[str] = field(default_factory=set)
    all_binary: bool = False  # `binary_data_output`: every output not said otherwise


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON part, binary part) of a body under the binary-data extension."""
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise body_error(
            "Inference-Header-Content-Length is not a number.", "Inference-Header-Content-Length"
        ) from None
    if not 0 <= length <= len(body):
        raise body_error(
            f"Inference-Header-Content-Length {length} is outside the body ({len(body)} bytes).",
            "Inference-Header-Content-Length",
        )
    return body[:length], body[length:]


def infer_body(body: Any, binary: bytes) -> InferBody:
    if not isinstance(body, dict):
        raise body_error("The body must be a JSON object (KServe v2 infer request).")
    unknown = sorted(set(body) - _INFER_KEYS)
    if unknown:
        raise body_error(
            f"{shown(unknown[0])}: unknown field of the infer request; the fields are {', '.join(sorted(_INFER_KEYS))}",
            shown(unknown[0]),
        )
    # request parameters other than binary_data_output are not acted on: the
    # tier decides the priority, and sequence batching is not served
    parameters = _object(body.get("parameters", {}), "parameters")
    tensors = body.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise body_error("inputs: must be a non-empty list of input tensors", "inputs")
    items, offset = [], 0
    for index, tensor in enumerate(tensors):
        item, size = _input(index, tensor, binary, offset)
        items.append(item)
        offset += size
    if offset != len(binary):
        raise body_error(
            f"binary_data_size: the inputs' sizes add up to {offset} bytes, the binary part holds {len(binary)}",
            "binary_data_size",
        )
    decoded = InferBody(items, caller_id(body.get("id")), all_binary=parameters.get("binary_data_output") is True)
    outputs = body.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise body_error("outputs: must be a list of requested outputs", "outputs")
        decoded.requested = []
        for index, requested in enumerate(outputs):
            requested = _object(requested, f"outputs[{index}]")
            name = requested.get("name")
            if not isinstance(name, str):
                raise body_error(f"outputs[{index}]: needs a string name", "outputs")
            options = _object(requested.get("parameters", {}), f"{shown(name)}.parameters")
            _no_shared_memory(name, options)
            decoded.requested.append(name)
            binary_flag = options.get("binary_data")
            if binary_flag is True or (binary_flag is None and decoded.all_binary):
                decoded.binary_outputs.add(name)
    return decoded


def _input(index: int, tensor: Any, binary: bytes, offset: int) -> tuple[WireInput, int]:
    """One input and the number of binary bytes it takes."""
    tensor = _object(tensor, f"inputs[{index}]")
    name = tensor.get("name")
    if not isinstance(name, str):
        raise body_error(f"inputs[{index}]: needs a string name", "inputs")
    datatype = tensor.get("datatype")
    if not isinstance(datatype, str):
        raise input_error(shown(name), "needs a string datatype")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise input_error(shown(name), "shape must be a list of integers")
    parameters = _object(tensor.get("parameters", {}), f"{shown(name)}.parameters")
    _no_shared_memory(name, parameters)
    size = parameters.get("binary_data_size")
    if size is None:
        if "data" not in tensor:
            raise input_error(shown(name), "needs data (or binary_data_size with the binary-data extension)")
        data = tensor["data"]
        return WireInput(name, datatype, tuple(shape), lambda: _flatten(data)), 0
    if "data" in tensor:
        raise input_error(shown(name), "has both data and binary_data_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise input_error(shown(name), "binary_data_size must be an integer >= 0")
    if offset + size > len(binary):
        raise input_error(shown(name), f"binary_data_size {size} runs past the end of the body")
    chunk = binary[offset : offset + size]
    return WireInput(name, datatype, tuple(shape), lambda: decode_raw(datatype, chunk)), size


def _flatten(data: Any) -> list[Any]:
    """Row-major values of `data`, nested lists or flat (Triton takes both)."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            if isinstance(value, dict):
                raise ValueError("data must hold values or lists of values, not objects")
            out.append(value)
        else:
            stack.pop()
    return out


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise body_error(f"{where}: must be a JSON object", where.split("[")[0].split(".")[-1])
    return value


def _no_shared_memory(name: str, parameters: Mapping[str, Any]) -> None:
    if any(key in parameters for key in _SHARED_MEMORY):
        raise input_error(shown(name), "shared memory is not served through the gateway; send the data")
