"""The text stages' settings: what the adapters (preprocessing,
postprocessing, llm_bls) read from their config.pbtxt, and the one
definition of the text section of the deployment settings (serving/settings.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .inbound.llm_request import EngineMaxTokens, LLMRequestBuilder
from .inbound.prompt import PromptBuilder, PromptConfig
from .outbound.content_filter import ContentFilterRules
from .tokenizer_info import TokenizerInfo, load_tokenizer_info


@dataclass(frozen=True)
class TextStageConfig(PromptConfig):
    """The `text` section: the prompt builder's bounds plus the output filter."""

    content_filter_rules: str = ""  # path to a JSON rules file; empty: no filter


# Values the text stages read from the engine's and the server's settings
# (rendered next to the text settings, never defined here).
SHARED_PARAMETERS = ("model_dir", "llm_model_name", "default_max_tokens", "max_tokens_limit", "max_model_len")


class StageSettingsError(ValueError):
    pass


@dataclass
class TextStageSettings:
    parameters: dict[str, str]
    instance_count: int = 1

    @classmethod
    def from_model_config(cls, model_config: str | dict[str, Any]) -> TextStageSettings:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        missing = [name for name in SHARED_PARAMETERS if name not in params]
        if missing or not params["model_dir"]:
            raise StageSettingsError(
                f"parameters {', '.join(missing or ['model_dir'])}: required (rendered by `python -m serving render`)"
            )
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        return cls(params, instances)

    @cached_property
    def config(self) -> TextStageConfig:
        names = {f.name for f in fields(TextStageConfig)}
        try:
            return TypeAdapter(TextStageConfig).validate_python(
                {k: v for k, v in self.parameters.items() if k in names}
            )
        except ValidationError as exc:
            raise StageSettingsError(str(exc)) from None

    @cached_property
    def tokenizer_info(self) -> TokenizerInfo:
        return load_tokenizer_info(self.parameters["model_dir"])

    @property
    def llm_model_name(self) -> str:
        """The LLM step the text stages call (requests, stops)."""
        return self.parameters["llm_model_name"]

    def request_builder(self) -> LLMRequestBuilder:
        max_model_len = self.parameters["max_model_len"]
        prompts = PromptBuilder(self.tokenizer_info, self.config, int(max_model_len) if max_model_len else None)
        limits = EngineMaxTokens(
            default_max_tokens=int(self.parameters["default_max_tokens"]),
            max_tokens_limit=int(self.parameters["max_tokens_limit"]),
        )
        return LLMRequestBuilder(self.tokenizer_info, prompts, limits)

    def content_filter(self) -> ContentFilterRules | None:
        path = self.config.content_filter_rules
        return ContentFilterRules.from_json_file(path) if path else None
