"""Generated parts of the `config.pbtxt` templates: the public tensor lists and
the ensemble's wiring of them, rendered from `contract.public_tensors` so the
list is written once (not in each of `ensemble`, `llm_bls` and `preprocessing`);
and the tensorrt_llm variant's blocks (`trtllm_blocks`: TensorRT-LLM's backend
model from serving/trtllm/engine_config.py, the thin step's own parameters)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

from contract.public_tensors import (
    PUBLIC_INPUTS,
    PUBLIC_OUTPUTS,
    TensorSpec,
    ensemble_output_name,
    postprocessing_output_name,
)
from python_llm.engine.config import EngineConfig

from .settings import ServerConfig
from .trtllm import engine_config as trtllm

_INDENT = "  "


def _tensor(spec: TensorSpec, optional: bool) -> str:
    dims = ", ".join(str(d) for d in spec.dims)
    return (
        f'{{ name: "{spec.name}" data_type: {spec.data_type} dims: [ {dims} ]{" optional: true" if optional else ""} }}'
    )


def tensor_list(specs: Iterable[TensorSpec], optional: bool) -> str:
    return ",\n".join(_INDENT + _tensor(spec, optional) for spec in specs)


def input_map(pairs: Iterable[tuple[str, str]], indent: int = 3) -> str:
    """`input_map` lines of an ensemble step: (the step's input, the ensemble tensor)."""
    pad = _INDENT * indent
    return "\n".join(f'{pad}input_map {{ key: "{key}" value: "{value}" }}' for key, value in pairs).lstrip()


def output_map(pairs: Iterable[tuple[str, str]], indent: int = 3) -> str:
    """`output_map` lines of an ensemble step: (the step's output, the ensemble tensor)."""
    pad = _INDENT * indent
    return "\n".join(f'{pad}output_map {{ key: "{key}" value: "{value}" }}' for key, value in pairs).lstrip()


def _string_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    # inside "..." in pbtxt: escape what would end the string
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def parameters_block(parameters: Mapping[str, object]) -> str:
    """A model's `parameters` entries (Triton passes them as strings)."""
    return "\n".join(
        f'parameters: {{ key: "{key}" value: {{ string_value: "{_string_value(value)}" }} }}'
        for key, value in parameters.items()
    )


def config_blocks() -> dict[str, str]:
    """Template placeholders → generated pbtxt text (inserted verbatim)."""
    return {
        # every public input is optional: the text stages name what is missing (HTTP 400)
        "public_inputs": tensor_list(PUBLIC_INPUTS, optional=True),
        "public_outputs": tensor_list(PUBLIC_OUTPUTS, optional=False),
        "ensemble_public_outputs": tensor_list(
            (dataclasses.replace(t, name=ensemble_output_name(t.name)) for t in PUBLIC_OUTPUTS), optional=False
        ),
        # preprocessing sees every public input, so any request reaches the stage
        # that validates it (a request of only `temperature` would otherwise give
        # the preprocessing step no input at all, a Triton-internal error)
        "preprocessing_input_map": input_map((t.name, t.name) for t in PUBLIC_INPUTS),
        "postprocessing_output_map": output_map(
            (postprocessing_output_name(t.name), ensemble_output_name(t.name)) for t in PUBLIC_OUTPUTS
        ),
        "llm_public_input_map": input_map((t.llm_input, t.name) for t in PUBLIC_INPUTS if t.llm_input),
    }


def bridge_max_live_requests(engine: EngineConfig, bls_max_concurrent_requests: int) -> int:
    """How many requests the thin `tensorrt_llm` step holds (one thread each):
    what TensorRT-LLM itself admits (max_num_seqs running + max_queue_size
    queued); beyond it the step answers `overloaded:` itself."""
    if engine.max_queue_size > 0:
        return engine.max_num_seqs + engine.max_queue_size
    return max(bls_max_concurrent_requests, engine.max_num_seqs)


def trtllm_blocks(engine: EngineConfig, server: ServerConfig, engine_dir: str | Path) -> dict[str, str]:
    """Placeholders of the tensorrt_llm variant's templates (`tensorrt_llm`,
    `tensorrt_llm_engine`)."""
    bridge = {
        "engine_model_name": trtllm.ENGINE_MODEL_NAME,
        "max_live_requests": bridge_max_live_requests(engine, server.bls_max_concurrent_requests),
    }
    return {
        "trtllm_engine_inputs": ",\n".join(trtllm.tensor_line(t) for t in trtllm.ENGINE_INPUTS),
        "trtllm_engine_outputs": ",\n".join(trtllm.tensor_line(t) for t in trtllm.ENGINE_OUTPUTS),
        "trtllm_engine_parameters": parameters_block(trtllm.engine_parameters(engine, engine_dir)),
        "trtllm_dynamic_batching": trtllm.dynamic_batching_block(server.max_batch_size, engine.max_queue_size),
        "trtllm_bridge_parameters": parameters_block(bridge),
    }
