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


def _scalar(tensors: Mapping[str, np.ndarray], name: str, default: object) -> object:
    array = tensors.get(name)
    if array is None:
        return default
    flat = np.asarray(array).reshape(-1)
    if flat.size == 0:
        return default
    if flat.size != 1:
        raise InvalidRequestError(name, f"expected one value, got {flat.size}")
    value = flat[0]
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(name, "not valid UTF-8") from None
    return value.item() if hasattr(value, "item") else value


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
    stop = bool(_scalar(tensors, "stop", False))
    try:
        request_key = parse_request_key(_scalar(tensors, "request_key", None))
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
    length = _scalar(tensors, "input_lengths", len(prompt))
    if not 0 < int(length) <= len(prompt):
        raise InvalidRequestError("input_lengths", f"{length} does not fit input_ids of {len(prompt)} tokens")
    prompt = prompt[: int(length)]
    continued = int(_scalar(tensors, "continuation_length", 0))
    if not 0 <= continued < len(prompt):
        raise InvalidRequestError("continuation_length", f"{continued} must be in [0, {len(prompt)}): input_ids "
                                                         f"of {len(prompt)} tokens must keep at least one prompt token")
    prompt, continuation = prompt[:len(prompt) - continued], prompt[len(prompt) - continued:]

    # public_bounds: anything but the neutral value would be ignored (no beam search)
    length_penalty = float(_scalar(tensors, "len_penalty", 1.0))
    problem = bound_problem("length_penalty", length_penalty)
    if problem is not None:
        raise InvalidRequestError("length_penalty", problem, internal="len_penalty")
    # pad_id has nothing to pad: outputs are never padded (accepted for TensorRT-LLM clients)
    end_id = _scalar(tensors, "end_id", None)
    # absent or negative: None, the engine's "all of the model's EOS ids"
    stop_ids = None if end_id is None or int(end_id) < 0 else [int(end_id)]
    seed = _scalar(tensors, "seed", None)
    timeout = _scalar(tensors, "token_timeout_ms", None)
    max_tokens = _scalar(tensors, "request_output_len", None)   # absent: the engine's default_max_tokens
    sampling = SamplingParams(
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=float(_scalar(tensors, "temperature", 1.0)),  # neutral; 0 = greedy
        top_k=int(_scalar(tensors, "runtime_top_k", 0)),
        top_p=float(_scalar(tensors, "runtime_top_p", 1.0)) or 1.0,
        repetition_penalty=float(_scalar(tensors, "repetition_penalty", 1.0)),
        presence_penalty=float(_scalar(tensors, "presence_penalty", 0.0)),
        frequency_penalty=float(_scalar(tensors, "frequency_penalty", 0.0)),
        min_tokens=int(_scalar(tensors, "min_tokens", 0)),
        seed=None if seed is None else int(seed),
        ignore_eos=bool(_scalar(tensors, "ignore_eos", False)),
        stop_token_ids=stop_ids,
        stop_words_ids=_word_list(tensors, "stop_words_list"),
        bad_words_ids=_word_list(tensors, "bad_words_list"),
        return_log_probs=bool(_scalar(tensors, "return_log_probs", False)),
        token_timeout_ms=None if timeout is None else int(timeout),
    )
    return LLMRequest(
        prompt_token_ids=prompt,
        sampling=sampling,
        priority=int(_scalar(tensors, "priority", 0)),
        streaming=bool(_scalar(tensors, "streaming", False)),
        exclude_input_in_output=bool(_scalar(tensors, "exclude_input_in_output", True)),
        request_key=request_key,
        stop=False,
        context=_raw_bytes(tensors.get("request_context")),
        continuation_ids=continuation,
    )
