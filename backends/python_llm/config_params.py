"""config.pbtxt `parameters` (strings) → EngineConfig, with clear errors.
The repository renders every EngineConfig field under its own name
(serving/repository.py); pydantic converts the strings by the fields' types."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pydantic import TypeAdapter, ValidationError

from .engine.config import ConfigError, EngineConfig

# TensorRT-LLM parameter names that carry no meaning for this engine but are
# accepted so one repository reads the same to both backends' tools.
IGNORED = {"gpt_model_type", "batch_scheduler_policy", "exclude_input_in_output"}
ALIASES = {"gpt_model_path": "model_dir", "tokens_per_block": "block_size"}
_ADAPTER = TypeAdapter(EngineConfig)


def engine_config_from_parameters(parameters: Mapping[str, str]) -> EngineConfig:
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    values: dict[str, object] = {}
    for key, raw in parameters.items():
        name = ALIASES.get(key, key)
        if name in IGNORED or name not in names:
            continue
        # an empty string is how the renderer writes None (e.g. max_model_len unset)
        if raw.strip() == "" and name != "model_dir":
            continue
        values[name] = raw.strip()
    if not values.get("model_dir"):
        raise ConfigError("parameter model_dir: required (the HF model folder)")
    try:
        return _ADAPTER.validate_python(values)
    except ValidationError as exc:
        raise ConfigError(
            "; ".join(f"parameter {'.'.join(map(str, e['loc'])) or 'engine'}: {e['msg']}" for e in exc.errors())
        ) from None
