"""What the gateway says about itself and the public models, in KServe v2's
JSON and protobuf shapes: server metadata, model metadata and the model
configuration, all rendered from `contract/public_tensors.py` (the gateway
never forwards Triton's own, which describe the internal steps too).

The models are described as the gateway serves them: one request per call
(`max_batch_size: 1`, a batch dimension of -1 in the metadata shapes, as
Triton reports it), decoupled (`ModelStreamInfer` streams; `ModelInfer` and
`infer` answer once with `stream: false`)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from contract.public_tensors import PUBLIC_INPUTS, PUBLIC_OUTPUTS, TensorSpec, ensemble_output_name

from ..core.errors import GatewayError
from ..core.upstream import PUBLIC_MODELS
from .inputs import WIRE_DATATYPES
from .outputs import MODEL_VERSION

SERVER_NAME = "triton"
SERVER_VERSION = "2.51.0"  # the Triton the gateway fronts; the protocol is its
# KServe v2 / Triton extensions the gateway serves for the public models
EXTENSIONS = ("binary_tensor_data", "parameters", "generate")
_PLATFORMS = {"ensemble": "ensemble", "llm_bls": "python"}
BATCH = -1  # the metadata's batch dimension


def unknown_model(model: str, version: str = "") -> GatewayError:
    """Triton's own words for a model it does not serve."""
    what = f"'{model}'" if not version else f"'{model}' version {version}"
    return GatewayError(404, f"Request for unknown model: {what} is not found", param="model")


def check_served(model: str, version: str = "") -> None:
    if model not in PUBLIC_MODELS or version not in ("", MODEL_VERSION):
        raise unknown_model(model, version)


def _outputs(model: str) -> list[tuple[str, TensorSpec]]:
    return [(ensemble_output_name(s.name) if model == "ensemble" else s.name, s) for s in PUBLIC_OUTPUTS]


def server_json() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}


def server_proto() -> service_pb2.ServerMetadataResponse:
    return service_pb2.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)


def model_json(model: str) -> dict[str, Any]:
    def tensor(name: str, spec: TensorSpec) -> dict[str, Any]:
        return {"name": name, "datatype": WIRE_DATATYPES[spec.data_type], "shape": [BATCH, *spec.dims]}

    return {
        "name": model,
        "versions": [MODEL_VERSION],
        "platform": _PLATFORMS[model],
        "inputs": [tensor(s.name, s) for s in PUBLIC_INPUTS],
        "outputs": [tensor(name, s) for name, s in _outputs(model)],
    }


def model_proto(model: str) -> service_pb2.ModelMetadataResponse:
    return json_format.ParseDict(model_json(model), service_pb2.ModelMetadataResponse())


def model_config(model: str) -> model_config_pb2.ModelConfig:
    """What tools that read the configuration need (genai-perf and
    perf_analyzer look for `decoupled` before streaming)."""
    config = model_config_pb2.ModelConfig(name=model, max_batch_size=1)
    if model == "ensemble":
        config.platform = "ensemble"
    else:
        config.backend = "python"
    for spec in PUBLIC_INPUTS:
        config.input.add(
            name=spec.name,
            data_type=model_config_pb2.DataType.Value(spec.data_type),
            dims=list(spec.dims),
            optional=True,
        )
    for name, spec in _outputs(model):
        config.output.add(name=name, data_type=model_config_pb2.DataType.Value(spec.data_type), dims=list(spec.dims))
    config.model_transaction_policy.decoupled = True
    return config


def config_json(model: str) -> dict[str, Any]:
    config = json_format.MessageToDict(model_config(model), preserving_proto_field_name=True)
    # protobuf's JSON writes int64 as strings; Triton's config JSON has numbers
    for tensor in (*config.get("input", ()), *config.get("output", ())):
        tensor["dims"] = [int(d) for d in tensor["dims"]]
    return config
