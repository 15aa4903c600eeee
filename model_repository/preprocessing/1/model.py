"""Triton adapter for `preprocessing`: request tensors → prompt ids, word
lists and a fresh request key. Logic lives in ensemble.llm_request."""
from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils

from ensemble.errors import InvalidInputError
from ensemble.llm_request import LLMRequestBuilder, RequestLimits
from ensemble.prompt import PromptBuilder, PromptConfig
from ensemble.tokenizer_info import load_tokenizer_info


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        info = load_tokenizer_info(params["model_dir"])
        prompts = PromptBuilder(info, PromptConfig(default_system_prompt=params.get("default_system_prompt") or None))
        limits = RequestLimits(default_max_tokens=int(params["default_max_tokens"]),
                               max_tokens_limit=int(params["max_tokens_limit"]))
        self.builder = LLMRequestBuilder(info, prompts, limits)

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request):
        def get(name: str):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        try:
            arrays = self.builder.build(get)
        except InvalidInputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])
