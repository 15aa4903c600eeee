"""Renders the deployable model repository from `model_repository/`.

Each model folder holds `config.pbtxt.template` with `${name}` placeholders,
filled from the deployment settings (`serving/settings.py`, one source of
truth): the server section's values by name, and generated blocks (the public
tensor lists, the ensemble's wiring, each model's `parameters`), so nobody
edits a config.pbtxt by hand.

`server.llm_model_name` picks the LLM step every stage calls, and so the
variant: `python_llm` (the project's engine) or `tensorrt_llm` (the thin step
`tensorrt_llm` in front of TensorRT-LLM's backend model `tensorrt_llm_engine`,
serving/trtllm/). Models of the other variant are not rendered, except
`python_llm`, whose config is the engine settings' rendering (tools and tests
read it); `python -m serving launch-trtllm` loads only its variant's models.
"""

from __future__ import annotations

import dataclasses
import shutil
import string
from pathlib import Path

from .model_config_blocks import config_blocks, parameters_block, trtllm_blocks
from .paths import REPO_ROOT
from .settings import DeploymentSettings
from .trtllm.engine_config import ENGINE_MODEL_NAME, default_engine_dir

TEMPLATE_NAME = "config.pbtxt.template"
# TensorRT-LLM's parameters that carry no meaning for python_llm, kept so one
# repository reads the same to TensorRT-LLM's tools
TRTLLM_CONSTANTS = {"gpt_model_type": "inflight_fused_batching", "batch_scheduler_policy": "max_utilization"}
# server.llm_model_name -> the models of that variant's LLM step
LLM_VARIANTS: dict[str, tuple[str, ...]] = {
    "python_llm": ("python_llm",),
    "tensorrt_llm": ("tensorrt_llm", ENGINE_MODEL_NAME),
}
TEXT_MODELS: tuple[str, ...] = ("preprocessing", "ensemble", "llm_bls", "postprocessing")
# rendered in every variant (see the module's docstring)
ALWAYS_RENDERED = frozenset({"python_llm"})


def llm_variant(settings: DeploymentSettings) -> str:
    name = settings.server.llm_model_name
    if name not in LLM_VARIANTS:
        raise ValueError(
            f"server.llm_model_name: {name!r} is not an LLM step of this repository; one of {', '.join(LLM_VARIANTS)}"
        )
    return name


def variant_models(settings: DeploymentSettings) -> tuple[str, ...]:
    """The models a server of this variant loads: the text stages, both entry
    points and the variant's LLM step."""
    return TEXT_MODELS + LLM_VARIANTS[llm_variant(settings)]


def _skipped_models(settings: DeploymentSettings) -> set[str]:
    chosen = set(LLM_VARIANTS[llm_variant(settings)])
    others = {model for models in LLM_VARIANTS.values() for model in models}
    return others - chosen - ALWAYS_RENDERED


def engine_parameters(settings: DeploymentSettings) -> dict[str, object]:
    """The LLM step's `parameters`: every engine setting, by its own name."""
    return {**TRTLLM_CONSTANTS, **dataclasses.asdict(settings.engine)}


def text_stage_parameters(settings: DeploymentSettings) -> dict[str, object]:
    """The text stages' `parameters`: their own section plus the engine and
    server values they must agree with (ensemble/stage_settings.py)."""
    engine, server = settings.engine, settings.server
    return {
        "model_dir": engine.model_dir,
        "llm_model_name": server.llm_model_name,
        "default_max_tokens": engine.default_max_tokens,
        "max_tokens_limit": engine.max_tokens_limit,
        "max_model_len": engine.max_model_len,
        **dataclasses.asdict(settings.text),
    }


def template_values(settings: DeploymentSettings, trtllm_engine_dir: str | Path | None = None) -> dict[str, str]:
    """`trtllm_engine_dir`: the TensorRT-LLM engine folder (default: the one
    `build-trtllm` writes, inside the model folder)."""
    values = {name: str(value) for name, value in dataclasses.asdict(settings.server).items()}
    values["engine_parameters"] = parameters_block(engine_parameters(settings))
    values["text_stage_parameters"] = parameters_block(text_stage_parameters(settings))
    values.update(config_blocks())
    engine_dir = trtllm_engine_dir or default_engine_dir(settings.engine.model_dir)
    values.update(trtllm_blocks(settings.engine, settings.server, engine_dir))
    return values


def render_repository(
    settings: DeploymentSettings,
    target: Path,
    source: Path = REPO_ROOT / "model_repository",
    trtllm_engine_dir: str | Path | None = None,
) -> Path:
    """Copy `source` to `target`, rendering every config template of the
    variant `server.llm_model_name` picks."""
    values = template_values(settings, trtllm_engine_dir)
    skipped = _skipped_models(settings)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for model in skipped:
        shutil.rmtree(target / model, ignore_errors=True)
    for template in target.glob(f"*/{TEMPLATE_NAME}"):
        try:
            text = string.Template(template.read_text()).substitute(values)
        except KeyError as missing:
            raise ValueError(f"{template.relative_to(target)}: no value for placeholder {missing}") from None
        template.with_name("config.pbtxt").write_text(text)
        template.unlink()
    return target
