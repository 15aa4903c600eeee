"""Renders the deployable model repository from `model_repository/`.

Each model folder holds `config.pbtxt.template` with `${name}` placeholders,
filled from the deployment settings (`serving/settings.py`, one source of
truth): the server section's values by name, and generated blocks (the public
tensor lists, the ensemble's wiring, each model's `parameters`), so nobody
edits a config.pbtxt by hand.
"""
from __future__ import annotations

import dataclasses
import shutil
import string
from pathlib import Path

from .model_config_blocks import config_blocks, parameters_block
from .paths import REPO_ROOT
from .settings import DeploymentSettings

TEMPLATE_NAME = "config.pbtxt.template"
# TensorRT-LLM's parameters that carry no meaning for python_llm, kept so one
# repository reads the same to TensorRT-LLM's tools
TRTLLM_CONSTANTS = {"gpt_model_type": "inflight_fused_batching", "batch_scheduler_policy": "max_utilization"}


def engine_parameters(settings: DeploymentSettings) -> dict[str, object]:
    """The LLM step's `parameters`: every engine setting, by its own name."""
    return {**TRTLLM_CONSTANTS, **dataclasses.asdict(settings.engine)}


def text_stage_parameters(settings: DeploymentSettings) -> dict[str, object]:
    """The text stages' `parameters`: their own section plus the engine and
    server values they must agree with (ensemble/stage_settings.py)."""
    engine, server = settings.engine, settings.server
    return {"model_dir": engine.model_dir, "llm_model_name": server.llm_model_name,
            "default_max_tokens": engine.default_max_tokens, "max_tokens_limit": engine.max_tokens_limit,
            "max_model_len": engine.max_model_len, **dataclasses.asdict(settings.text)}


def template_values(settings: DeploymentSettings) -> dict[str, str]:
    values = {name: str(value) for name, value in dataclasses.asdict(settings.server).items()}
    values["engine_parameters"] = parameters_block(engine_parameters(settings))
    values["text_stage_parameters"] = parameters_block(text_stage_parameters(settings))
    values.update(config_blocks())
    return values


def render_repository(settings: DeploymentSettings, target: Path,
                      source: Path = REPO_ROOT / "model_repository") -> Path:
    """Copy `source` to `target`, rendering every config template."""
    values = template_values(settings)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for template in target.glob(f"*/{TEMPLATE_NAME}"):
        try:
            text = string.Template(template.read_text()).substitute(values)
        except KeyError as missing:
            raise ValueError(f"{template.relative_to(target)}: no value for placeholder {missing}") from None
        template.with_name("config.pbtxt").write_text(text)
        template.unlink()
    return target
