"""config.pbtxt `parameters` (strings) → EngineConfig, with clear errors."""
from __future__ import annotations

import dataclasses
from typing import Mapping

from .engine.config import ConfigError, EngineConfig

# TensorRT-LLM parameter names that carry no meaning for this engine but are
# accepted so one repository template serves both backends.
IGNORED = {"gpt_model_type", "batch_scheduler_policy", "exclude_input_in_output"}
ALIASES = {"gpt_model_path": "model_dir", "tokens_per_block": "block_size"}


def _convert(field: dataclasses.Field, raw: str) -> object:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    text = raw.strip()
    if "None" in kind and text == "":
        return None
    if "bool" in kind:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"{field.name}: expected true/false, got {raw!r}")
        return text.lower() in ("true", "1")
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("float"):
        return float(text)
    return text


def engine_config_from_parameters(parameters: Mapping[str, str]) -> EngineConfig:
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    values: dict[str, object] = {}
    for key, raw in parameters.items():
        name = ALIASES.get(key, key)
        if name in IGNORED or name not in fields:
            continue
        try:
            values[name] = _convert(fields[name], raw)
        except ValueError as exc:
            raise ConfigError(f"parameter {key}: {exc}") from None
    if "model_dir" not in values:
        raise ConfigError("parameter model_dir: required (the HF model folder)")
    return EngineConfig(**values)  # type: ignore[arg-type]
