"""Triton adapter for `preprocessing`: request tensors → prompt ids, word
lists, the request key (the caller's, or a fresh one) and the request_context
for the steps after the LLM step. Logic lives in ensemble.inbound.llm_request."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from contract.errors import InvalidInputError
from ensemble.stage_settings import TextStageSettings


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.builder = TextStageSettings.from_model_config(args["model_config"]).request_builder()

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request) -> pb_utils.InferenceResponse:
        def get(name: str) -> np.ndarray | None:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        try:
            arrays = self.builder.build(get)
        except InvalidInputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])
