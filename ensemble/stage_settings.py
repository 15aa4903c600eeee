"""What the text-stage adapters (preprocessing, postprocessing, llm_bls) read
from their config.pbtxt, in one place."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .content_filter import ContentFilterRules
from .llm_request import LLMRequestBuilder, RequestLimits
from .prompt import PromptBuilder, PromptConfig
from .tokenizer_info import TokenizerInfo, load_tokenizer_info


@dataclass
class TextStageSettings:
    parameters: dict[str, str]
    instance_count: int = 1

    @classmethod
    def from_model_config(cls, model_config: str | dict[str, Any]) -> "TextStageSettings":
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        if not params.get("model_dir"):
            raise ValueError("parameter model_dir: required (the HF model folder)")
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        return cls(params, instances)

    @cached_property
    def tokenizer_info(self) -> TokenizerInfo:
        return load_tokenizer_info(self.parameters["model_dir"])

    @property
    def llm_model_name(self) -> str:
        """The LLM step the text stages call (requests, stops)."""
        return self.parameters.get("llm_model_name") or "python_llm"

    def _optional_int(self, name: str) -> int | None:
        value = int(self.parameters.get(name) or 0)
        return value or None      # 0 or absent: derived by the consumer

    def request_builder(self) -> LLMRequestBuilder:
        prompts = PromptBuilder(self.tokenizer_info, PromptConfig(
            default_system_prompt=self.parameters.get("default_system_prompt") or None,
            max_messages=int(self.parameters.get("max_messages") or PromptConfig.max_messages),
            max_messages_depth=int(self.parameters.get("max_messages_depth") or PromptConfig.max_messages_depth),
            max_text_input_bytes=self._optional_int("max_text_input_bytes"),
            max_messages_bytes=self._optional_int("max_messages_bytes")))
        limits = RequestLimits(default_max_tokens=int(self.parameters.get("default_max_tokens", "128")),
                               max_tokens_limit=int(self.parameters.get("max_tokens_limit", "4096")))
        return LLMRequestBuilder(self.tokenizer_info, prompts, limits)

    def content_filter(self) -> ContentFilterRules | None:
        path = self.parameters.get("content_filter_rules") or ""
        return ContentFilterRules.from_json_file(path) if path else None
