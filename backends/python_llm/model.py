"""Triton adapter for the `python_llm` backend: tensors in, engine calls,
tensors out. Decoupled: execute() returns at once; the engine loop thread
answers through each request's response sender. All logic lives in the
importable `python_llm` package."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid

import triton_python_backend_utils as pb_utils

from contract.request_key import STOP_NEEDS_KEY, STOP_UNKNOWN_KEY, mint_request_key
from ensemble.requested_outputs import requested_only
from python_llm.config_params import engine_config_from_parameters
from python_llm.engine.core.errors import DuplicateRequestError, EngineDeadError, InvalidRequestError, OverloadedError
from python_llm.engine.core.outputs import RequestOutput
from python_llm.engine.launch import launch
from python_llm.live_streams import LiveStream, LiveStreamTable
from python_llm.request_inputs import parse_llm_request
from python_llm.response_pacing import ResponsePacing
from python_llm.response_tensors import output_arrays
from python_llm.stream_assembly import Reply, StreamAssembly
from python_llm.triton_metrics import TritonMetrics

log = logging.getLogger("python_llm")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
_REJECTIONS = (InvalidRequestError, OverloadedError, DuplicateRequestError, EngineDeadError)


def _kill_server_after(grace_s: float) -> None:
    time.sleep(grace_s)
    # the stub's parent is tritonserver; SIGKILL because its graceful signals exit 0
    os.kill(os.getppid(), signal.SIGKILL)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("python_llm must be decoupled (model_transaction_policy)")
        params = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        self.config = engine_config_from_parameters(params)
        self.input_names = [i["name"] for i in model_config["input"]]
        self.metrics = TritonMetrics(
            pb_utils,
            args["model_name"],
            args["model_version"],
            max_num_seqs=self.config.max_num_seqs,
            tokens_per_block=self.config.block_size,
        )
        self.registry = LiveStreamTable()
        self.pacing = ResponsePacing(self.config.stream_response_share, self.config.stream_max_hold_ms / 1000)
        # built on its own loop thread: one OpenMP team in this process (see launch)
        self.engine = launch(self.config, metrics=self.metrics, on_dead=self._on_engine_dead)
        log.info(
            "python_llm ready: %s",
            {
                "model_dir": self.config.model_dir,
                "device": self.config.device,
                "dtype": self.config.dtype,
                "kv_blocks": self.engine.stats(),
            },
        )

    # -- requests ------------------------------------------------------------
    def execute(self, requests: list) -> None:
        for request in requests:
            self._accept(request)
        return None

    def _accept(self, request) -> None:
        sender = request.get_response_sender()
        client_id = request.request_id() or None
        tensors = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                tensors[name] = tensor.as_numpy()
        engine_id = None
        stream = None
        try:
            parsed = parse_llm_request(tensors)
            if parsed.stop:
                self._stop(sender, parsed.request_key, client_id)
                return
            engine_id = uuid.uuid4().hex
            # the echo (exclude_input_in_output false) repeats the ids as sent, continuation included
            assembly = StreamAssembly(parsed.streaming, parsed.input_ids, parsed.exclude_input_in_output)
            stream = LiveStream(
                engine_id,
                parsed.request_key or mint_request_key(),
                client_id,
                sender,
                assembly,
                parsed.context,
                requested_outputs=frozenset(request.requested_output_names()),
            )
            self.registry.register(stream)
            self.engine.add_request(
                engine_id,
                parsed.prompt_token_ids,
                parsed.sampling,
                priority=parsed.priority,
                on_output=self._on_output,
                continuation_ids=parsed.continuation_ids,
            )
        except _REJECTIONS as exc:
            error = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
            if stream is not None and not isinstance(exc, DuplicateRequestError):
                self.registry.remove(stream.engine_id)
                stream.send(error, FINAL, final=True)  # closes the stream: nothing sends after it
            else:
                sender.send(error, flags=FINAL)

    def _stop(self, sender, key: str | None, client_id: str | None) -> None:
        """Only the request's key stops it: a stop by request id alone, or with
        a wrong key, changes nothing and says so."""
        if key is None:
            refusal = STOP_NEEDS_KEY
        elif (engine_id := self.registry.engine_id_for_key(key)) is None:
            refusal = STOP_UNKNOWN_KEY
        else:
            self.engine.abort(engine_id, "cancelled")
            sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
            return
        log.info("stop refused: %s", {"request_id": client_id, "reason": refusal})
        sender.send(
            pb_utils.InferenceResponse(error=pb_utils.TritonError(refusal, pb_utils.TritonError.INVALID_ARG)),
            flags=FINAL,
        )

    # -- engine thread -------------------------------------------------------
    def _on_output(self, out: RequestOutput) -> None:
        try:
            self._answer(out)
        except Exception as exc:
            # the engine ends the request and calls this no more for it
            log.error("answering request failed: %s", {"engine_id": out.request_id, "error": repr(exc)})
            self.registry.end_failed(
                out.request_id,
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"internal error answering the request ({type(exc).__name__})")
                ),
                FINAL,
            )
            raise

    def _answer(self, out: RequestOutput) -> None:
        started = time.perf_counter()
        stream = self.registry.get(out.request_id)
        if stream is None:
            return
        # The client's disconnect / gRPC cancel is checked here, on the engine
        # thread that also sends (and sets the metrics), at most every
        # cancel_check_interval() of a running request: the stub crashed under
        # load when another thread called into it concurrently (a thread of
        # its own for the sends crashed it too, with the metrics on this one).
        # A request still queued is noticed when it starts (its timeouts bound
        # the wait).
        if not out.finished and self.registry.is_newly_cancelled(stream):
            self.engine.abort(out.request_id, "cancelled")
        if out.finished:
            self.registry.remove(out.request_id)
        reply = stream.assembly.respond(out, self.pacing.hold_ns(out) if stream.assembly.streaming else 0)
        if reply is not None:
            self._send(stream, self._response(stream, out, reply), FINAL if reply.final else 0)
            # the engine thread's whole time for it (the cancel check, its
            # tensors, the send's round trip), which the pacing budgets
            self.pacing.record_response(time.perf_counter() - started)

    @staticmethod
    def _response(stream: LiveStream, out: RequestOutput, reply: Reply):
        if reply.error is not None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(reply.error))
        arrays = requested_only(
            output_arrays(out, reply.token_ids, reply.logprobs, stream.context, stream.key), stream.requested_outputs
        )
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])

    def _send(self, stream: LiveStream, response, flags: int) -> None:
        try:
            stream.send(response, flags, final=bool(flags & FINAL))
        except Exception as exc:  # the client is gone: stop spending work on it
            log.info(
                "send failed, aborting request: %s",
                {"request_id": stream.client_id, "engine_id": stream.engine_id, "error": str(exc)},
            )
            self.registry.remove(stream.engine_id)
            self.engine.abort(stream.engine_id, "cancelled")

    def _on_engine_dead(self, exc: BaseException) -> None:
        """The engine already ended every in-flight request with an error and
        rejects new ones. Triton 2.51 keeps reporting a broken Python model as
        ready (server #8604), so the failure is made visible the one way a
        supervisor cannot miss: the server exits non-zero."""
        grace = self.config.exit_on_engine_failure_s
        log.error(
            "python_llm engine loop failed: %s; %s",
            exc,
            f"killing tritonserver in {grace} s" if grace >= 0 else "serving errors only",
        )
        if grace >= 0:
            threading.Thread(target=_kill_server_after, args=(grace,), name="python_llm-exit", daemon=True).start()

    def finalize(self) -> None:
        self.engine.shutdown(timeout=10)
