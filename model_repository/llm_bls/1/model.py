"""Triton adapter for `llm_bls`: the public entry point with the ensemble's
tensors, orchestrating prompt building, the LLM step and the text stages in
Python (ensemble.bls_flow). Decoupled: each request runs on a worker thread."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from contract.stop_inputs import stop_inputs
from ensemble.bls_flow import BLSCallbacks, LLMStepError, run_bls_request
from ensemble.bls_responses import RetiredResponses, cancelled_with_release, decoupled_responses
from ensemble.outbound.public_outputs import LLM_RESPONSE_OUTPUTS, LLMResponse, llm_response_from
from ensemble.outbound.shared_state import InProcessStateStore
from ensemble.outbound.stream_postprocessor import StreamPostprocessor
from ensemble.requested_outputs import requested_only
from ensemble.stage_settings import TextStageSettings

log = logging.getLogger("llm_bls")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _output_getter(response) -> Callable[[str], np.ndarray | None]:
    def get(name: str) -> np.ndarray | None:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        return None if tensor is None else tensor.as_numpy()

    return get


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        settings = TextStageSettings.from_model_config(args["model_config"])
        self.builder = settings.request_builder()
        # one request = one thread here, so stream state never leaves it
        self.post = StreamPostprocessor(
            settings.tokenizer_info.tokenizer, InProcessStateStore(), settings.content_filter()
        )
        self.llm_model = settings.llm_model_name
        self.pool = ThreadPoolExecutor(
            max_workers=int(settings.parameters["bls_max_concurrent_requests"]), thread_name_prefix="llm_bls"
        )
        self.retired = RetiredResponses()

    def execute(self, requests: list) -> None:
        for request in requests:
            self.pool.submit(self._serve, request)
        return None

    def _serve(self, request) -> None:
        sender = request.get_response_sender()
        requested = frozenset(request.requested_output_names())

        def get(name: str) -> np.ndarray | None:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        def call_llm(inputs: dict[str, np.ndarray]) -> Iterator[LLMResponse]:
            llm_request = pb_utils.InferenceRequest(
                model_name=self.llm_model,
                inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
                requested_output_names=list(LLM_RESPONSE_OUTPUTS),
            )
            for response in decoupled_responses(llm_request, self.retired):
                if response.has_error():
                    raise LLMStepError(response.error().message())
                if not response.output_tensors():
                    continue  # an empty final marker
                yield llm_response_from(_output_getter(response))

        def stop_llm(key: str) -> None:
            stop = pb_utils.InferenceRequest(
                model_name=self.llm_model,
                requested_output_names=[],
                inputs=[pb_utils.Tensor(name, value) for name, value in stop_inputs(key).items()],
            )
            for response in stop.exec(decoupled=True):
                if response.has_error():
                    log.info("stop: %s", response.error().message())

        def is_cancelled() -> bool:
            return cancelled_with_release(sender, self.retired)

        def send(arrays: dict[str, np.ndarray], final: bool) -> None:
            if is_cancelled():  # nobody listens; still close the request
                if final:
                    sender.send(flags=FINAL)
                return
            tensors = [pb_utils.Tensor(k, v) for k, v in requested_only(arrays, requested).items()]
            sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)

        def send_error(message: str) -> None:
            if is_cancelled():
                sender.send(flags=FINAL)
            else:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)

        try:
            run_bls_request(
                get, self.builder, self.post, BLSCallbacks(call_llm, stop_llm, send, send_error, is_cancelled)
            )
        except Exception as exc:  # never leave a client without a final response
            log.exception("llm_bls request failed")
            send_error(f"llm_bls: internal error: {type(exc).__name__}: {exc}")

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
