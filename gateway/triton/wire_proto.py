"""A KServe v2 `ModelInferRequest` (protobuf) as `WireInput`s for the one
validator: values from the datatype's `contents` field or from
`raw_input_contents` (one per input, then no `contents` at all), decoded only
once inputs.py has accepted the name, datatype and shape. Nothing of the
caller's message is forwarded as bytes: the gateway re-sends the validated
values through the client library."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from tritonclient.grpc import service_pb2

from ..bodies.strict_json import shown
from ..core.errors import GatewayError
from ..core.policy import Caller
from ..ops import logs
from .inputs import ValidatedCall, WireInput, caller_id, input_error, validate
from .outputs import check_requested
from .raw import decode_raw

# InferTensorContents' field for each datatype (KServe v2 gRPC protocol)
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_FIELDS = frozenset(CONTENTS_FIELDS.values())
_SHARED_MEMORY = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


@dataclass(frozen=True)
class ProtoRequest:
    inputs: list[WireInput]
    caller_id: str | None
    requested: list[str] | None  # the outputs asked for; None: all


def proto_request(request: service_pb2.ModelInferRequest) -> ProtoRequest:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise GatewayError(
            400,
            f"raw_input_contents: {len(raw)} given for {len(request.inputs)} inputs (one per input, in order)",
            param="raw_input_contents",
        )
    items = []
    for index, tensor in enumerate(request.inputs):
        if any(key in tensor.parameters for key in _SHARED_MEMORY):
            raise input_error(shown(tensor.name), "shared memory is not served through the gateway; send the data")
        if raw:
            if tensor.HasField("contents"):
                raise input_error(shown(tensor.name), "has both contents and raw_input_contents")
            items.append(
                WireInput(
                    tensor.name, tensor.datatype, tuple(tensor.shape), partial(decode_raw, tensor.datatype, raw[index])
                )
            )
        else:
            items.append(WireInput(tensor.name, tensor.datatype, tuple(tensor.shape), partial(_contents, tensor)))
    requested = None
    if request.outputs:
        requested = []
        for output in request.outputs:
            if any(key in output.parameters for key in _SHARED_MEMORY):
                raise input_error(shown(output.name), "shared memory is not served through the gateway")
            requested.append(output.name)
    return ProtoRequest(items, caller_id(request.id), requested)


def _contents(tensor: service_pb2.ModelInferRequest.InferInputTensor) -> list[object]:
    field = CONTENTS_FIELDS.get(tensor.datatype)
    if field is None:  # pragma: no cover (inputs.py refused the datatype first)
        raise ValueError(f"datatype {tensor.datatype} is not supported")
    for other in _ALL_FIELDS - {field}:
        if len(getattr(tensor.contents, other)):
            raise ValueError(f"values given in {other}, which is not the field of datatype {tensor.datatype}")
    return list(getattr(tensor.contents, field))


def validated_request(
    caller: Caller, request: service_pb2.ModelInferRequest, stream_refusal: str | None
) -> tuple[ValidatedCall, list[str] | None]:
    """The request decoded, its inputs validated under the caller's tier and
    its requested outputs checked (a 400 otherwise); the Triton request id is
    the gateway's (the bound request context's)."""
    decoded = proto_request(request)
    context = logs.current()
    call = validate(
        request.model_name,
        decoded.inputs,
        tier=caller.tier,
        request_id=context.request_id if context else logs.new_request_id(),
        caller_id=decoded.caller_id,
        stream_refusal=stream_refusal,
    )
    check_requested(request.model_name, decoded.requested)
    return call, decoded.requested
