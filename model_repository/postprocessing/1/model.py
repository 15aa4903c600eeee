"""Triton adapter for `postprocessing`: one LLM response → one text delta.
Stream state moves between instances through ensemble.shared_state; the
logic lives in ensemble.stream_postprocessor."""
from __future__ import annotations

import hashlib
import json
import logging
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from ensemble.content_filter import ContentFilterRules
from ensemble.errors import InvalidInputError, decode_utf8_field
from ensemble.shared_state import InProcessStateStore, SqliteStateStore, StreamOrderError
from ensemble.stream_postprocessor import LLMDelta, StreamPostprocessor
from ensemble.tokenizer_info import load_tokenizer_info

log = logging.getLogger("postprocessing")
PASSTHROUGH = {  # LLM output → public output, sent when asked for
    "cum_log_probs": ("cum_log_probs_out", "return_log_probs"),
    "output_log_probs": ("output_log_probs_out", "return_log_probs"),
    "arrival_time_ns": ("arrival_time_ns_out", "return_perf_metrics"),
    "first_token_time_ns": ("first_token_time_ns_out", "return_perf_metrics"),
    "last_token_time_ns": ("last_token_time_ns_out", "return_perf_metrics"),
}
# what an output holds when not asked for (shapes include the batch dimension)
EMPTY = {
    "cum_log_probs_out": np.zeros((1, 0), dtype=np.float32),
    "output_log_probs_out": np.zeros((1, 0, 0), dtype=np.float32),
    "arrival_time_ns_out": np.zeros((1, 1), dtype=np.int64),
    "first_token_time_ns_out": np.zeros((1, 1), dtype=np.int64),
    "last_token_time_ns_out": np.zeros((1, 1), dtype=np.int64),
}


def _array(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _first(request, name: str, default=None):
    array = _array(request, name)
    if array is None or array.size == 0:
        return default
    value = array.reshape(-1)[0]
    return decode_utf8_field(name, value) if isinstance(value, bytes) else value.item()


def _state_store(args: dict, instances: int):
    if instances <= 1:
        return InProcessStateStore()
    # one store per deployed repository, shared by its instances only
    tag = hashlib.sha1(os.path.realpath(args["model_repository"]).encode()).hexdigest()[:16]
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else os.path.dirname(args["model_repository"])
    return SqliteStateStore(os.path.join(folder, f"triton-llm-postprocessing-{tag}.sqlite"))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        info = load_tokenizer_info(params["model_dir"])
        rules_path = params.get("content_filter_rules") or ""
        rules = ContentFilterRules.from_json_file(rules_path) if rules_path else None
        instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", [])) or 1
        self.store = _state_store(args, instances)
        self.steps = StreamPostprocessor(info.tokenizer, self.store, rules)

    def execute(self, requests: list) -> list:
        # in arrival order: a later delta of a stream may wait for an earlier one
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            ids = _array(request, "output_ids")
            token_ids = ids.reshape(-1).tolist() if ids is not None else []
            key = _first(request, "request_key", "") or ""
            engine_reason = _first(request, "finish_reason", "") or ""
            stop_words = _array(request, "stop_words")
            stop_strings = [decode_utf8_field("stop_words", w) for w in stop_words.reshape(-1)] \
                if stop_words is not None else []
            delta = LLMDelta(key=key, token_ids=token_ids,
                             sequence_length=int(_first(request, "sequence_length", len(token_ids))),
                             engine_finish_reason=engine_reason or None,
                             streaming=bool(_first(request, "stream", False)))
            result = self.steps.process(delta, stop_strings, _first(request, "segment", None))
        except (InvalidInputError, StreamOrderError) as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if result.stop_engine:
            self._stop_engine(key)
        out = {
            "text_output": np.asarray([[result.text.encode()]], dtype=np.object_),
            "finish_reason_out": np.asarray([[(result.finish_reason or "").encode()]], dtype=np.object_),
            "num_input_tokens_out": np.asarray([[int(_first(request, "num_input_tokens", 0))]], dtype=np.int32),
            "num_output_tokens": np.asarray([[len(token_ids)]], dtype=np.int32),
            "output_ids_out": np.asarray([token_ids if _first(request, "return_output_ids", False) else []],
                                         dtype=np.int32),
        }
        for source, (target, flag) in PASSTHROUGH.items():
            array = _array(request, source)
            if array is not None and _first(request, flag, False):
                out[target] = array
            else:
                out[target] = EMPTY[target]
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in out.items()])

    def _stop_engine(self, key: str) -> None:
        """A stop string or filter ended the stream: free the engine request now."""
        inputs = [pb_utils.Tensor("input_ids", np.zeros((1, 1), dtype=np.int32)),
                  pb_utils.Tensor("stop", np.ones((1, 1), dtype=np.bool_)),
                  pb_utils.Tensor("request_key", np.asarray([[key.encode()]], dtype=np.object_))]
        request = pb_utils.InferenceRequest(model_name="python_llm", inputs=inputs, requested_output_names=[])
        try:
            for response in request.exec(decoupled=True):
                if response.has_error():
                    log.info("stop after text-stage finish: %s", response.error().message())
        except Exception as exc:  # best effort: max_tokens and the token timeout still bound it
            log.warning("could not stop engine request %s: %s", key, exc)
