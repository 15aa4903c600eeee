"""A test double of TensorRT-LLM's `tensorrt_llm` backend model (0.14), as a
decoupled Python model, for checking the tensorrt_llm variant on a CPU machine
(tests/e2e/test_trtllm_variant.py). It keeps the behaviour the thin step relies
on, as tensorrtllm_backend v0.14.0's inflight_batcher_llm/src does:

- inputs and outputs under TensorRT-LLM's names; `output_ids` [1, beam 1, n] and
  `sequence_length` [1, 1] = the ids in this response (new tokens only when
  `exclude_input_in_output`), one response per token when streaming, one at
  the end otherwise, the last one flagged final;
- `request_output_len` new tokens at most, `end_id` ends a request (not
  returned) unless fewer than `min_length` tokens were generated;
- `stop` with a Triton request id cancels the live request of that id
  (`handleStopRequest`): its stream ends with a final response; the stop
  itself gets an empty final response, and a stop without an id an error;
- a full queue is refused with the executor's message.

Its "model": token t+1 follows t (ids from the last input id), with
`end_id` once the last input id is a multiple of 50 and 3 tokens came (so a
prompt can ask for an EOS stop). One token every `FAKE_TOKEN_DELAY_S`."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TOKEN_DELAY_S = 0.02
VOCAB_LOW, VOCAB_HIGH = 1000, 9000  # plain word pieces of SmolLM2's vocabulary
MAX_LIVE = 64


def _scalar(request, name: str, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    return tensor.as_numpy().reshape(-1)[0].item()


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.config = json.loads(args["model_config"])
        self.lock = threading.Lock()
        self.live: dict[str, threading.Event] = {}  # Triton request id -> cancelled

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            request_id = request.request_id()
            if _scalar(request, "stop", False):
                if not request_id:
                    sender.send(
                        pb_utils.InferenceResponse(
                            error=pb_utils.TritonError("Trying to stop a request but request ID is not provided")
                        ),
                        flags=FINAL,
                    )
                    continue
                with self.lock:
                    event = self.live.get(request_id)
                if event is not None:
                    event.set()
                sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=FINAL)
                continue
            with self.lock:
                if len(self.live) >= MAX_LIVE:
                    sender.send(
                        pb_utils.InferenceResponse(
                            error=pb_utils.TritonError(
                                "Executor failed process requestId 0 due to the following error: "
                                f"Maximum queue size of {MAX_LIVE} has been reached, please try again later"
                            )
                        ),
                        flags=FINAL,
                    )
                    continue
                cancelled = threading.Event()
                if request_id:
                    self.live[request_id] = cancelled
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1).tolist()
            length = int(_scalar(request, "input_lengths", len(ids)))
            threading.Thread(
                target=self._generate,
                daemon=True,
                args=(
                    sender,
                    request_id,
                    cancelled,
                    ids[:length],
                    int(_scalar(request, "request_output_len", 16)),
                    int(_scalar(request, "end_id", -1)),
                    int(_scalar(request, "min_length", 0)),
                    bool(_scalar(request, "streaming", False)),
                    bool(_scalar(request, "exclude_input_in_output", False)),
                    bool(_scalar(request, "return_log_probs", False)),
                ),
            ).start()
        return None

    @staticmethod
    def _response(ids: list[int], log_probs: bool) -> pb_utils.InferenceResponse:
        tensors = [
            pb_utils.Tensor("output_ids", np.asarray([[ids]], dtype=np.int32)),
            pb_utils.Tensor("sequence_length", np.asarray([[len(ids)]], dtype=np.int32)),
        ]
        if log_probs:
            tensors += [
                pb_utils.Tensor("cum_log_probs", np.asarray([[-0.5 * len(ids)]], dtype=np.float32)),
                pb_utils.Tensor("output_log_probs", np.asarray([[[-0.5] * len(ids)]], dtype=np.float32)),
            ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _generate(
        self, sender, request_id, cancelled, prompt, max_new, end_id, min_length, streaming, exclude_input, log_probs
    ) -> None:
        produced: list[int] = []
        token = prompt[-1]
        wants_eos = prompt[-1] % 50 == 0
        try:
            while len(produced) < max_new and not cancelled.is_set():
                time.sleep(TOKEN_DELAY_S)
                if wants_eos and len(produced) >= max(3, min_length) and end_id >= 0:
                    break  # end_id: ends it, not returned
                token = VOCAB_LOW + (token + 1 - VOCAB_LOW) % (VOCAB_HIGH - VOCAB_LOW)
                produced.append(token)
                if streaming and len(produced) < max_new:
                    sender.send(self._response([token], log_probs))
            if streaming:
                last = [produced[-1]] if produced and len(produced) == max_new else []
                sender.send(self._response(last, log_probs), flags=FINAL)
            else:
                ids = produced if exclude_input else prompt + produced
                sender.send(self._response(ids, log_probs), flags=FINAL)
        finally:
            with self.lock:
                if request_id:
                    self.live.pop(request_id, None)
