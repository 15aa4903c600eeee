"""Renders the deployable model repository from `model_repository/`.

Each model folder holds `config.pbtxt.template` with `${name}` placeholders;
the values that differ between deployments come from `DeploymentSettings`
(one source of truth), so nobody edits a config.pbtxt by hand.
"""
from __future__ import annotations

import shutil
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ensemble.prompt import PromptConfig

from .model_config_blocks import config_blocks
from .paths import REPO_ROOT

TEMPLATE_NAME = "config.pbtxt.template"


@dataclass
class DeploymentSettings:
    model_dir: str
    max_batch_size: int = 64
    # engine (python_llm), TensorRT-LLM parameter names where they exist
    block_size: int = 16
    max_tokens_in_paged_kv_cache: int = 16384
    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_queue_size: int = 256
    max_tokens_limit: int = 4096
    default_max_tokens: int = 128
    default_token_timeout_ms: int = 0
    enable_kv_cache_reuse: bool = True
    enable_chunked_context: bool = True
    llm_model_name: str = "python_llm"      # or "tensorrt_llm" in the GPU container
    device: str = "cpu"
    dtype: str = "float32"
    num_threads: int = 0
    attention_backend: str = "auto"         # "auto": native CPU decode kernel when it builds; "torch"
    debug_step_delay_ms: int = 0
    debug_fail_after_steps: int = 0
    exit_on_engine_failure_s: float = 2.0
    # text stages
    preprocessing_instances: int = 1
    postprocessing_instances: int = 1
    default_system_prompt: str = ""
    content_filter_rules: str = ""          # path to a JSON rules file, or empty
    # request bounds checked before parsing / tokenizing (0: derived from the context)
    max_text_input_bytes: int = 0
    max_messages_bytes: int = 0
    max_messages: int = PromptConfig.max_messages
    max_messages_depth: int = PromptConfig.max_messages_depth
    extra: dict[str, str] = field(default_factory=dict)

    def template_values(self) -> dict[str, str]:
        values = {k: v for k, v in asdict(self).items() if k != "extra"}
        values.update(self.extra)
        return {k: _pbtxt_value(v) for k, v in values.items()}


def _pbtxt_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    # placed inside "..." in templates: escape what would end the string
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def render_repository(settings: DeploymentSettings, target: Path,
                      source: Path = REPO_ROOT / "model_repository") -> Path:
    """Copy `source` to `target`, rendering every config template."""
    # generated blocks go in verbatim; setting values are escaped for "..." strings
    values = {**settings.template_values(), **config_blocks()}
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
