"""Triton adapter for `postprocessing`: one LLM response → one text delta.
Stream state moves between instances through ensemble.outbound.shared_state; the
logic lives in ensemble.outbound.stream_postprocessor."""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from contract.errors import InvalidInputError
from contract.public_tensors import postprocessing_output_name
from contract.stop_inputs import stop_inputs
from ensemble.inbound.llm_request import scalar
from ensemble.outbound.public_outputs import ReturnFlags, llm_response_from, public_output_arrays
from ensemble.outbound.shared_state import InProcessStateStore, SqliteStateStore, StateStore, StreamOrderError
from ensemble.outbound.stream_postprocessor import LLMDelta, StreamPostprocessor
from ensemble.request_context import RequestContext
from ensemble.stage_settings import TextStageSettings

log = logging.getLogger("postprocessing")


def _state_store(args: dict, instances: int) -> StateStore:
    if instances <= 1:
        return InProcessStateStore()
    # one store per deployed repository, shared by its instances only
    tag = hashlib.sha1(os.path.realpath(args["model_repository"]).encode()).hexdigest()[:16]
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else os.path.dirname(args["model_repository"])
    return SqliteStateStore(os.path.join(folder, f"triton-llm-postprocessing-{tag}.sqlite"))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        settings = TextStageSettings.from_model_config(args["model_config"])
        self.llm_model = settings.llm_model_name
        self.steps = StreamPostprocessor(
            settings.tokenizer_info.tokenizer, _state_store(args, settings.instance_count), settings.content_filter()
        )

    def execute(self, requests: list) -> list:
        # in arrival order: a later delta of a stream may wait for an earlier one
        return [self._one(request) for request in requests]

    def _one(self, request) -> pb_utils.InferenceResponse:
        def get(name: str) -> np.ndarray | None:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        try:
            llm = llm_response_from(get)
            context = RequestContext.from_json(scalar(get, "request_context"))
            key = context.key
            delta = LLMDelta(
                key=key,
                token_ids=llm.token_ids,
                sequence_length=llm.sequence_length,
                engine_finish_reason=llm.finish_reason,
                streaming=context.stream,
            )
            result = self.steps.process(delta, context.stop_words, context.segment, context.primed_ids)
        except (InvalidInputError, StreamOrderError) as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if result.stop_engine:
            self._stop_engine(key)
        arrays = public_output_arrays(result.text, result.finish_reason, llm, ReturnFlags.of(context), key)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(postprocessing_output_name(name), value) for name, value in arrays.items()]
        )

    def _stop_engine(self, key: str) -> None:
        """A stop string or filter ended the stream: free the engine request now."""
        inputs = [pb_utils.Tensor(name, value) for name, value in stop_inputs(key).items()]
        request = pb_utils.InferenceRequest(model_name=self.llm_model, inputs=inputs, requested_output_names=[])
        try:
            for response in request.exec(decoupled=True):
                if response.has_error():
                    log.info("stop after text-stage finish: %s", response.error().message())
        except Exception as exc:  # best effort: max_tokens and the token timeout still bound it
            log.warning("could not stop an engine request: %s", exc)
