"""Public request fields → the LLM step's input arrays (TensorRT-LLM names).
Shared by the `preprocessing` adapter and `llm_bls`, so both entry points
validate and build requests the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from contract.errors import InvalidInputError, decode_utf8_field
from contract.public_tensors import PUBLIC_TO_LLM
from contract.request_key import adopt_or_mint

from ..request_context import RequestContext
from ..tokenizer_info import TokenizerInfo
from .prompt import PromptBuilder
from .word_lists import encode_word_list, to_word_list

# a tensor getter: input name → numpy array or None when absent
Getter = Callable[[str], "np.ndarray | None"]


@dataclass(frozen=True)
class EngineMaxTokens:
    """The engine's own `default_max_tokens` and `max_tokens_limit` (rendered
    into the text stages' configs from the engine settings): the text stages
    must agree with the engine, so they hold no defaults of their own."""

    default_max_tokens: int
    max_tokens_limit: int


def strings(get: Getter, name: str) -> list[str] | None:
    array = get(name)
    if array is None:
        return None
    return [decode_utf8_field(name, raw) for raw in np.asarray(array).reshape(-1)]


def scalar(get: Getter, name: str):
    array = get(name)
    if array is None or np.asarray(array).size == 0:
        return None
    value = np.asarray(array).reshape(-1)[0]
    return decode_utf8_field(name, value) if isinstance(value, bytes) else value.item()


class LLMRequestBuilder:
    def __init__(self, info: TokenizerInfo, prompts: PromptBuilder, limits: EngineMaxTokens) -> None:
        self.info = info
        self.prompts = prompts
        self.limits = limits
        self._empty_words = to_word_list([])[None]

    def build(self, get: Getter) -> dict[str, np.ndarray]:
        """The preprocessing outputs for one request; raises InvalidInputError.
        The request key is the caller's (`request_key`) or a fresh one."""
        text = strings(get, "text_input")
        if text is None:
            raise InvalidInputError("text_input", "required")
        key = adopt_or_mint(scalar(get, "request_key"))
        messages = strings(get, "messages")
        max_tokens = _checked_max_tokens(scalar(get, "max_tokens"), self.limits)
        # counted before any tokenizing: the ids are bounded by max_tokens
        continuation = _checked_continuation(get("continuation_ids"), max_tokens)
        built = self.prompts.build(text[0] if text else None, messages[0] if messages else None, max_tokens)
        input_ids = built.input_ids + continuation
        stop = encode_word_list("stop_words", strings(get, "stop_words"), self.info.tokenizer)
        bad = encode_word_list("bad_words", strings(get, "bad_words"), self.info.tokenizer)
        end_id, pad_id = scalar(get, "end_id"), scalar(get, "pad_id")
        context = RequestContext(
            key=key,
            stream=bool(scalar(get, "stream")),
            stop_words=strings(get, "stop_words") or [],
            segment=scalar(get, "segment") or "token",
            return_log_probs=bool(scalar(get, "return_log_probs")),
            return_perf_metrics=bool(scalar(get, "return_perf_metrics")),
            return_output_ids=bool(scalar(get, "return_output_ids")),
            continuation_ids=continuation,
            echo_input=scalar(get, "exclude_input_in_output") is False,
        )
        return {
            "input_ids": np.asarray([input_ids], dtype=np.int32),
            "input_lengths": np.asarray([[len(input_ids)]], dtype=np.int32),
            # this project's LLM-step input: the trailing ids of input_ids that are output already generated
            "continuation_length": np.asarray([[len(continuation)]], dtype=np.int32),
            "request_output_len": np.asarray([[max_tokens]], dtype=np.int32),
            "stop_words_list": stop[None] if stop is not None else self._empty_words,
            "bad_words_list": bad[None] if bad is not None else self._empty_words,
            # -1: "all of the model's EOS ids" (the LLM step expands it)
            "out_end_id": np.asarray([[end_id if end_id is not None else -1]], dtype=np.int32),
            "out_pad_id": np.asarray([[pad_id if pad_id is not None else self.info.pad_id]], dtype=np.int32),
            "request_key": np.asarray([[key.encode()]], dtype=np.object_),
            "request_context": np.asarray([[context.to_json().encode()]], dtype=np.object_),
        }


def _checked_max_tokens(value: object, limits: EngineMaxTokens) -> int:
    if value is None:
        return limits.default_max_tokens
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError("max_tokens", f"must be a positive integer, got {value!r}")
    if value > limits.max_tokens_limit:
        raise InvalidInputError("max_tokens", f"must be <= {limits.max_tokens_limit}, got {value}")
    return value


def _checked_continuation(array: np.ndarray | None, max_tokens: int) -> list[int]:
    """The ids a previous replica already generated (a migrated stream). They
    count as output: `max_tokens` covers them and what is still to come, so as
    many ids as `max_tokens` leave nothing to generate."""
    if array is None:
        return []
    values = np.asarray(array).reshape(-1)
    if values.size == 0:
        return []
    if not np.issubdtype(values.dtype, np.integer):
        raise InvalidInputError("continuation_ids", f"must be integer token ids, got {values.dtype}")
    if values.size >= max_tokens:
        raise InvalidInputError(
            "continuation_ids",
            f"{values.size} ids leave nothing to generate within max_tokens {max_tokens} (they count as output)",
        )
    if values.min() < 0:
        raise InvalidInputError("continuation_ids", f"token ids must be >= 0, got {int(values.min())}")
    return [int(v) for v in values.tolist()]


def llm_inputs(preprocessed: dict[str, np.ndarray], get: Getter) -> dict[str, np.ndarray]:
    """What `ensemble`'s wiring does, in Python (for llm_bls): preprocessing
    outputs plus the sampling inputs under the LLM step's names."""
    inputs = {
        name: preprocessed[name]
        for name in (
            "input_ids",
            "input_lengths",
            "request_output_len",
            "stop_words_list",
            "bad_words_list",
            "continuation_length",
            "request_key",
        )
    }
    inputs["end_id"] = preprocessed["out_end_id"]
    inputs["pad_id"] = preprocessed["out_pad_id"]
    for public, llm in PUBLIC_TO_LLM.items():
        array = get(public)
        if array is not None:
            inputs[llm] = np.asarray(array).reshape(1, -1)
    return inputs
