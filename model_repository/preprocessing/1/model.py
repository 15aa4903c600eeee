"""Triton adapter for `preprocessing`: request tensors → prompt ids, word
lists and a fresh request key. Logic lives in the `ensemble` package."""
from __future__ import annotations

import json
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from ensemble.errors import InvalidInputError, decode_utf8_field
from ensemble.prompt import PromptBuilder, PromptConfig
from ensemble.tokenizer_info import load_tokenizer_info
from ensemble.word_lists import encode_word_list, to_word_list


def _strings(request, name: str) -> list[str] | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return [decode_utf8_field(name, raw) for raw in tensor.as_numpy().reshape(-1)]


def _int(request, name: str) -> int | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None or tensor.as_numpy().size == 0:
        return None
    return int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.info = load_tokenizer_info(params["model_dir"])
        self.default_max_tokens = int(params.get("default_max_tokens", "128"))
        self.max_tokens_limit = int(params.get("max_tokens_limit", "4096"))
        self.builder = PromptBuilder(self.info, PromptConfig(
            default_system_prompt=params.get("default_system_prompt") or None))
        self.empty_word_list = to_word_list([])[None]

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request):
        try:
            text = _strings(request, "text_input")
            messages = _strings(request, "messages")
            max_tokens = _int(request, "max_tokens")
            if max_tokens is None:
                max_tokens = self.default_max_tokens
            if max_tokens > self.max_tokens_limit:
                raise InvalidInputError("max_tokens", f"must be <= {self.max_tokens_limit}, got {max_tokens}")
            built = self.builder.build(text[0] if text else None, messages[0] if messages else None, max_tokens)
            tok = self.info.tokenizer
            stop = encode_word_list("stop_words", _strings(request, "stop_words"), tok)
            bad = encode_word_list("bad_words", _strings(request, "bad_words"), tok)
            end_id = _int(request, "end_id")
            pad_id = _int(request, "pad_id")
        except InvalidInputError as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        arrays = {
            "input_ids": np.asarray([built.input_ids], dtype=np.int32),
            "input_lengths": np.asarray([[len(built.input_ids)]], dtype=np.int32),
            "request_output_len": np.asarray([[max_tokens]], dtype=np.int32),
            "stop_words_list": stop[None] if stop is not None else self.empty_word_list,
            "bad_words_list": bad[None] if bad is not None else self.empty_word_list,
            # -1: "all of the model's EOS ids" (the LLM step expands it)
            "out_end_id": np.asarray([[end_id if end_id is not None else -1]], dtype=np.int32),
            "out_pad_id": np.asarray([[pad_id if pad_id is not None else self.info.pad_id]], dtype=np.int32),
            "request_key": np.asarray([[uuid.uuid4().hex.encode()]], dtype=np.object_),
        }
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in arrays.items()])
