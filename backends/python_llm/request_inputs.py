"""Turns the LLM step's input tensors (TensorRT-LLM names, see
docs/interface.md) into an engine request. Importable and testable without Triton:
the adapter hands over a plain dict of numpy arrays. It only converts: the
values are validated once, by the engine at intake (`SamplingParams.validate`
and what depends on the engine), with errors that name the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from contract.errors import InvalidInputError
from contract.public_bounds import bound_problem
from contract.request_key import parse_request_key
from ensemble.inbound.word_lists import parse_word_list

from .engine.core.sampling_params import InvalidRequestError, SamplingParams

__all__ = ["LLMRequest", "parse_llm_request"]


@dataclass
class LLMRequest:
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int
    streaming: bool
    exclude_input_in_output: bool
    request_key: str | None
    stop: bool
    context: bytes = b""
    # output ids a previous replica already generated: the trailing
    # `continuation_length` ids of input_ids (this project's extension)
    continuation_ids: list[int] = field(default_factory=list)

    @property
    def input_ids(self) -> list[int]:
        """The ids as sent: prompt, then continuation."""
        return self.prompt_token_ids + self.continuation_ids


# what one tensor element converts to (`.item()` of a numpy scalar, or bytes decoded)
Scalar = str | int | float | bool


def _scalar(tensors: Mapping[str, np.ndarray], name: str) -> Scalar | None:
    """The tensor's one value; None when the tensor is absent or empty."""
    array = tensors.get(name)
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if flat.size == 0:
        return None
    if flat.size != 1:
        raise InvalidRequestError(name, f"expected one value, got {flat.size}")
    value = flat[0]
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(name, "not valid UTF-8") from None
    item: Scalar = value.item() if isinstance(value, np.generic) else value
    return item


def _int(tensors: Mapping[str, np.ndarray], name: str, default: int) -> int:
    value = _scalar(tensors, name)
    return default if value is None else int(value)


def _optional_int(tensors: Mapping[str, np.ndarray], name: str) -> int | None:
    value = _scalar(tensors, name)
    return None if value is None else int(value)


def _float(tensors: Mapping[str, np.ndarray], name: str, default: float) -> float:
    value = _scalar(tensors, name)
    return default if value is None else float(value)


def _bool(tensors: Mapping[str, np.ndarray], name: str, default: bool) -> bool:
    value = _scalar(tensors, name)
    return default if value is None else bool(value)


def _text(tensors: Mapping[str, np.ndarray], name: str) -> str | None:
    value = _scalar(tensors, name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(name, "expected a string")
    return value


def _raw_bytes(array: np.ndarray | None) -> bytes:
    if array is None or np.asarray(array).size == 0:
        return b""
    value = np.asarray(array).reshape(-1)[0]
    return bytes(value) if isinstance(value, (bytes, np.bytes_)) else str(value).encode()


def _word_list(tensors: Mapping[str, np.ndarray], name: str) -> list[list[int]]:
    try:
        return parse_word_list(name, tensors.get(name))
    except InvalidInputError as exc:
        raise InvalidRequestError(exc.field, exc.problem) from None


def parse_llm_request(tensors: Mapping[str, np.ndarray]) -> LLMRequest:
    stop = _bool(tensors, "stop", False)
    try:
        request_key = parse_request_key(_text(tensors, "request_key"))
    except InvalidInputError as exc:
        raise InvalidRequestError(exc.field, exc.problem) from None
    if stop:
        return LLMRequest([], SamplingParams(), 0, False, True, request_key, True)

    ids = tensors.get("input_ids")
    if ids is None:
        raise InvalidRequestError("input_ids", "required")
    ids = np.asarray(ids)
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise InvalidRequestError("input_ids", f"expected batch size 1, got {ids.shape[0]}")
        ids = ids[0]
    prompt = [int(t) for t in ids.reshape(-1).tolist()]
    length = _int(tensors, "input_lengths", len(prompt))
    if not 0 < length <= len(prompt):
        raise InvalidRequestError("input_lengths", f"{length} does not fit input_ids of {len(prompt)} tokens")
    prompt = prompt[:length]
    continued = _int(tensors, "continuation_length", 0)
    if not 0 <= continued < len(prompt):
        raise InvalidRequestError(
            "continuation_length",
            f"{continued} must be in [0, {len(prompt)}): input_ids "
            f"of {len(prompt)} tokens must keep at least one prompt token",
        )
    prompt, continuation = prompt[: len(prompt) - continued], prompt[len(prompt) - continued :]

    # public_bounds: anything but the neutral value would be ignored (no beam search)
    length_penalty = _float(tensors, "len_penalty", 1.0)
    problem = bound_problem("length_penalty", length_penalty)
    if problem is not None:
        raise InvalidRequestError("length_penalty", problem, internal="len_penalty")
    # pad_id has nothing to pad: outputs are never padded (accepted for TensorRT-LLM clients)
    end_id = _optional_int(tensors, "end_id")
    # absent or negative: None, the engine's "all of the model's EOS ids"
    stop_ids = None if end_id is None or end_id < 0 else [end_id]
    # an absent setting takes SamplingParams' own default: one default per setting
    default = SamplingParams()
    sampling = SamplingParams(
        max_tokens=_optional_int(tensors, "request_output_len"),  # None: the engine's default_max_tokens
        temperature=_float(tensors, "temperature", default.temperature),
        top_k=_int(tensors, "runtime_top_k", default.top_k),
        top_p=_float(tensors, "runtime_top_p", default.top_p) or 1.0,  # 0 (TensorRT-LLM's "unset"): no cut
        repetition_penalty=_float(tensors, "repetition_penalty", default.repetition_penalty),
        presence_penalty=_float(tensors, "presence_penalty", default.presence_penalty),
        frequency_penalty=_float(tensors, "frequency_penalty", default.frequency_penalty),
        min_tokens=_int(tensors, "min_tokens", default.min_tokens),
        seed=_optional_int(tensors, "seed"),
        ignore_eos=_bool(tensors, "ignore_eos", default.ignore_eos),
        stop_token_ids=stop_ids,
        stop_words_ids=_word_list(tensors, "stop_words_list"),
        bad_words_ids=_word_list(tensors, "bad_words_list"),
        return_log_probs=_bool(tensors, "return_log_probs", default.return_log_probs),
        token_timeout_ms=_optional_int(tensors, "token_timeout_ms"),
    )
    return LLMRequest(
        prompt_token_ids=prompt,
        sampling=sampling,
        priority=_int(tensors, "priority", 0),
        streaming=_bool(tensors, "streaming", False),
        exclude_input_in_output=_bool(tensors, "exclude_input_in_output", True),
        request_key=request_key,
        stop=False,
        context=_raw_bytes(tensors.get("request_context")),
        continuation_ids=continuation,
    )
