"""Triton adapter for `tensorrt_llm`, the tensorrt_llm variant's LLM step: this
project's LLM-step tensors in front of TensorRT-LLM's backend model
(`tensorrt_llm_engine`), called over BLS. Decoupled: each request runs on a
worker thread of its own; the logic lives in `python_llm.trtllm_bridge`."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from contract.errors import OVERLOADED_MARKER
from contract.request_key import STOP_NEEDS_KEY, STOP_UNKNOWN_KEY, mint_request_key
from ensemble.bls_responses import RetiredResponses, cancelled_with_release, decoupled_responses
from ensemble.requested_outputs import requested_only
from python_llm.engine.core.errors import DuplicateRequestError
from python_llm.engine.core.sampling_params import InvalidRequestError
from python_llm.live_streams import LiveStream, LiveStreamTable
from python_llm.trtllm_bridge import (
    ENGINE_OUTPUT_NAMES,
    BridgeReply,
    BridgeSettings,
    Deadlines,
    EngineCall,
    EngineStream,
    engine_log_probs,
    engine_stop_inputs,
    engine_token_ids,
    prepare,
    reply_arrays,
)

log = logging.getLogger("tensorrt_llm")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
WATCHDOG_PERIOD_S = 0.05


def _tensors(names: list[str], request) -> dict[str, np.ndarray]:
    found = {}
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            found[name] = tensor.as_numpy()
    return found


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("tensorrt_llm must be decoupled (model_transaction_policy)")
        params = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        self.settings = BridgeSettings.from_parameters(params)
        self.input_names = [i["name"] for i in model_config["input"]]
        self.registry = LiveStreamTable()
        self.retired = RetiredResponses()
        self.deadlines = Deadlines()
        self.pool = ThreadPoolExecutor(
            max_workers=self.settings.max_live_requests + 8, thread_name_prefix="tensorrt_llm"
        )
        self._closing = threading.Event()
        self._watchdog = threading.Thread(target=self._watch_timeouts, name="tensorrt_llm-timeouts", daemon=True)
        self._watchdog.start()
        log.info(
            "tensorrt_llm ready: %s",
            {"engine_model": self.settings.engine_model, "model_dir": self.settings.engine.model_dir},
        )

    # -- requests ------------------------------------------------------------
    def execute(self, requests: list) -> None:
        for request in requests:
            self._accept(request)
        return None

    def _accept(self, request) -> None:
        sender = request.get_response_sender()
        client_id = request.request_id() or None
        try:
            call = prepare(_tensors(self.input_names, request), self.settings)
        except InvalidRequestError as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
            return
        if not isinstance(call, EngineCall):  # a stop
            self.pool.submit(self._stop, sender, call.request_key, client_id)
            return
        if len(self.registry) >= self.settings.max_live_requests:
            sender.send(
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        f"{OVERLOADED_MARKER} tensorrt_llm holds {len(self.registry)} requests, its most"
                    )
                ),
                flags=FINAL,
            )
            return
        # the engine's request id: this step's own, never shown; the key is the credential
        engine_id = uuid.uuid4().hex
        stream = LiveStream(
            engine_id,
            call.key or mint_request_key(),
            client_id,
            sender,
            EngineStream(call),
            call.request.context,
            requested_outputs=frozenset(request.requested_output_names()),
        )
        try:
            self.registry.register(stream)
        except DuplicateRequestError as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
            return
        self.deadlines.start(engine_id, call.token_timeout_ms)
        self.pool.submit(self._serve, stream)

    def _serve(self, stream: LiveStream) -> None:
        engine: EngineStream = stream.assembly
        try:
            final = self._relay(stream)
        except Exception as exc:  # never leave a caller without a final response
            log.exception("tensorrt_llm request failed")
            final = engine.on_error(f"{type(exc).__name__}: {exc}")
        try:
            self._release_finished_calls(stream)
            self._reply(stream, final)
        finally:
            self.registry.remove(stream.engine_id)
            self.deadlines.remove(stream.engine_id)

    def _relay(self, stream: LiveStream) -> BridgeReply | None:
        """The engine's responses to the caller; returns the final reply."""
        engine: EngineStream = stream.assembly
        inference = pb_utils.InferenceRequest(
            model_name=self.settings.engine_model,
            request_id=stream.engine_id,
            inputs=[pb_utils.Tensor(k, v) for k, v in engine.call.inputs.items()],
            requested_output_names=list(ENGINE_OUTPUT_NAMES),
        )
        for response in decoupled_responses(inference, self.retired):
            if response.has_error():
                return engine.on_error(response.error().message())
            if not response.output_tensors():
                continue  # the engine's empty final marker
            self.deadlines.touch(stream.engine_id)
            # the caller's disconnect, checked on the thread that sends (python_llm's rule)
            if self.registry.is_newly_cancelled(stream) and engine.request_stop("cancelled"):
                self._stop_engine(stream.engine_id)

            def out(name: str):
                tensor = pb_utils.get_output_tensor_by_name(response, name)  # noqa: B023
                return None if tensor is None else tensor.as_numpy()

            cum, per_token = engine_log_probs(out("cum_log_probs"), out("output_log_probs"))
            self._reply(stream, engine.on_response(engine_token_ids(out("output_ids")), cum, per_token))
        return engine.on_end()

    def _release_finished_calls(self, stream: LiveStream) -> None:
        """Frees the engine calls' finished responses (ensemble.bls_responses);
        before the final reply, while the sender may still be asked."""
        with stream.lock:
            if not stream.closed:
                cancelled_with_release(stream.sender, self.retired)

    def _reply(self, stream: LiveStream, reply: BridgeReply | None) -> None:
        if reply is None:
            return
        if reply.error is not None:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(reply.error))
        else:
            arrays = requested_only(
                reply_arrays(stream.assembly, reply, stream.context, stream.key), stream.requested_outputs
            )
            response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])
        try:
            stream.send(response, FINAL if reply.final else 0, final=reply.final)
        except Exception as exc:  # the caller is gone: stop spending the engine on it
            log.info("send failed, stopping the request: %s", {"request_id": stream.client_id, "error": str(exc)})
            if stream.assembly.request_stop("cancelled"):
                self._stop_engine(stream.engine_id)

    # -- stops ---------------------------------------------------------------
    def _stop(self, sender, key: str | None, client_id: str | None) -> None:
        """Only the request's key stops it (python_llm's rule and messages)."""
        stream = None
        if key is None:
            refusal = STOP_NEEDS_KEY
        elif (engine_id := self.registry.engine_id_for_key(key)) is None or (
            stream := self.registry.get(engine_id)
        ) is None:
            refusal = STOP_UNKNOWN_KEY
        else:
            if stream.assembly.request_stop("cancelled"):
                self._stop_engine(stream.engine_id)
            sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
            return
        log.info("stop refused: %s", {"request_id": client_id, "reason": refusal})
        sender.send(
            pb_utils.InferenceResponse(error=pb_utils.TritonError(refusal, pb_utils.TritonError.INVALID_ARG)),
            flags=FINAL,
        )

    def _stop_engine(self, engine_id: str) -> None:
        """TensorRT-LLM's stop: its `stop` input under the request id this step gave the request."""
        stop = pb_utils.InferenceRequest(
            model_name=self.settings.engine_model,
            request_id=engine_id,
            requested_output_names=[],
            inputs=[pb_utils.Tensor(k, v) for k, v in engine_stop_inputs().items()],
        )
        try:
            for response in stop.exec(decoupled=True):
                if response.has_error():
                    log.info("engine stop: %s", response.error().message())
        except Exception as exc:  # best effort: max_tokens still bounds the request
            log.warning("could not stop an engine request: %s", exc)

    def _watch_timeouts(self) -> None:
        while not self._closing.wait(WATCHDOG_PERIOD_S):
            for engine_id in self.deadlines.expired():
                stream = self.registry.get(engine_id)
                if stream is not None and stream.assembly.request_stop("timeout"):
                    self.pool.submit(self._stop_engine, engine_id)

    def finalize(self) -> None:
        self._closing.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
