"""Real Triton protobuf responses for the gRPC fakes, and reading back what a
fake received (tensor shapes, flags and string encoding are the real ones)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import deserialize_bytes_tensor


def response(
    text: str,
    finish: str | None = None,
    final: bool = False,
    ids: list[int] | None = None,
    request_key: str | None = None,
) -> InferResult:
    proto = service_pb2.ModelInferResponse(model_name="ensemble")
    outputs: list[tuple[str, str, np.ndarray]] = [
        ("text_output", "BYTES", np.array([[text.encode()]], dtype=np.object_)),
        ("num_output_tokens", "INT32", np.array([[1]], dtype=np.int32)),
    ]
    if finish:
        outputs.append(("finish_reason", "BYTES", np.array([[finish.encode()]], dtype=np.object_)))
    if ids:
        outputs.append(("output_ids", "INT32", np.array([ids], dtype=np.int32)))
    if request_key:
        outputs.append(("request_key", "BYTES", np.array([[request_key.encode()]], dtype=np.object_)))
    for name, datatype, array in outputs:
        proto.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if datatype == "BYTES":
            proto.raw_output_contents.append(b"".join(len(v).to_bytes(4, "little") + v for v in array.reshape(-1)))
        else:
            proto.raw_output_contents.append(array.tobytes())
    proto.parameters["triton_final_response"].bool_param = final
    return InferResult(proto)


def by_name(inputs: list[Any]) -> dict[str, Any]:
    return {i.name(): i for i in inputs}


def key_of(infer_input: Any) -> str:
    """The one string of a BYTES InferInput, as it goes on the wire."""
    (value,) = deserialize_bytes_tensor(infer_input._get_content())
    return value.decode()
