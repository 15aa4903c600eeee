"""The `tensorrt_llm` step: this project's LLM-step tensors (docs/interface.md,
"The LLM step") in front of TensorRT-LLM's Triton backend (`tensorrt_llm_engine`,
serving/trtllm/engine_config.py). Triton-free: the adapter (model_repository/tensorrt_llm/1/model.py)
hands in numpy arrays and turns the replies into responses.

TensorRT-LLM 0.14's backend neither echoes `request_context` nor knows a
`request_key`, stops a request by its Triton request id, has no finish reason,
no `continuation_length`, no per-token timeout, and names `min_tokens` /
`seed` `min_length` / `random_seed`. This step closes each gap:

- it keeps the request's key and context and puts them on every response;
- it calls the engine under a request id of its own (random, never shown), so
  a `stop` with the key (and only with it) becomes TensorRT-LLM's `stop` for
  that id; a stop by request id alone or with a wrong key is refused, as
  python_llm refuses it;
- continuation ids (the trailing `continuation_length` ids of `input_ids`) go
  to the engine as part of its input, and the step counts them as output:
  `request_output_len` and `min_length` shrink by them, `num_input_tokens` and
  `sequence_length` leave them out, `finish_reason: length` counts them;
- finish reasons: `length` when the output (continuation included) reaches
  `max_tokens`, `cancelled` after a keyed stop or the caller's disconnect,
  `timeout` after `token_timeout_ms` without a token (this step stops the
  engine request then), `stop` otherwise (EOS or a stop word);
- the input echo (`exclude_input_in_output` false) and the perf times are this
  step's, exactly as python_llm's (`stream_assembly.py`).

Not closed: `priority` is accepted and not acted on (the 0.14 backend has no
priority input), so this variant serves equal and unequal priorities FCFS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from contract.errors import OVERLOADED_MARKER
from ensemble.inbound.word_lists import to_word_list
from python_llm.config_params import engine_config_from_parameters
from python_llm.engine.config import ConfigError, EngineConfig
from python_llm.engine.core.request_limits import RequestLimits
from python_llm.engine.worker.model_info import ModelInfo
from python_llm.request_inputs import LLMRequest, parse_llm_request

# the engine's outputs this step asks for
ENGINE_OUTPUT_NAMES: tuple[str, ...] = ("output_ids", "sequence_length", "cum_log_probs", "output_log_probs")
# How TensorRT-LLM says its queue is full: the executor ("Maximum queue size of
# N has been reached, please try again later") and Triton's own queue policy.
_QUEUE_FULL = ("Maximum queue size", "Exceeds maximum queue size")


@dataclass(frozen=True)
class BridgeSettings:
    engine: EngineConfig
    model: ModelInfo
    engine_model: str
    max_live_requests: int  # requests held at once (one thread each)

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(
            max_tokens_limit=self.engine.max_tokens_limit,
            vocab_size=self.model.vocab_size,
            max_model_len=self.model.max_model_len,
            kv_capacity_tokens=None,
            prompt_token_budget=None,
        )

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> BridgeSettings:
        """The step's config.pbtxt parameters: the engine settings under their own
        names (as python_llm's), plus `engine_model_name` and `max_live_requests`
        (rendered by serving/model_config_blocks.py)."""
        missing = [name for name in ("engine_model_name", "max_live_requests") if not parameters.get(name)]
        if missing:
            raise ConfigError(f"parameters {', '.join(missing)}: required (rendered by `python -m serving render`)")
        engine = engine_config_from_parameters(parameters)
        model = ModelInfo.from_model_dir(engine.model_dir, engine.max_model_len)
        return cls(
            engine=engine,
            model=model,
            engine_model=parameters["engine_model_name"],
            max_live_requests=int(parameters["max_live_requests"]),
        )


@dataclass
class EngineCall:
    """One request, ready for the engine."""

    inputs: dict[str, np.ndarray]  # TensorRT-LLM's names, batch dimension first
    request: LLMRequest  # the request as this project's LLM step reads it
    max_tokens: int  # counts the continuation
    token_timeout_ms: int  # 0: none

    @property
    def key(self) -> str | None:
        return self.request.request_key


def _validate(request: LLMRequest, settings: BridgeSettings) -> int:
    """python_llm's intake rules (core/request_limits.py) but the KV cache's,
    which TensorRT-LLM checks itself. Returns max_tokens."""
    sampling = request.sampling
    max_tokens = settings.engine.default_max_tokens if sampling.max_tokens is None else sampling.max_tokens
    settings.limits.check(request.prompt_token_ids, request.continuation_ids, sampling, max_tokens)
    return max_tokens


def _one(value: object, dtype: type) -> np.ndarray:
    return np.asarray([[value]], dtype=dtype)


def prepare(tensors: Mapping[str, np.ndarray], settings: BridgeSettings) -> LLMRequest | EngineCall:
    """This project's LLM-step inputs -> a stop (the parsed request, `stop`
    set) or the engine's inputs. Raises InvalidRequestError naming the field."""
    request = parse_llm_request(tensors)
    if request.stop:
        return request
    max_tokens = _validate(request, settings)
    sampling = request.sampling
    continued = len(request.continuation_ids)
    ids = request.input_ids  # the prompt, then the continuation
    new_tokens = max_tokens - continued  # what is left to generate
    inputs: dict[str, np.ndarray] = {
        "input_ids": np.asarray([ids], dtype=np.int32),
        "input_lengths": _one(len(ids), np.int32),
        "request_output_len": _one(new_tokens, np.int32),
        "streaming": _one(request.streaming, np.bool_),
        # new tokens only: the echo is this step's (python_llm's rule: the ids as sent, first)
        "exclude_input_in_output": _one(True, np.bool_),
        "beam_width": _one(1, np.int32),
        "return_log_probs": _one(sampling.return_log_probs, np.bool_),
    }
    # penalties only when asked for: the neutral values are TensorRT-LLM's defaults too
    for name, value, neutral in (
        ("repetition_penalty", sampling.repetition_penalty, 1.0),
        ("presence_penalty", sampling.presence_penalty, 0.0),
        ("frequency_penalty", sampling.frequency_penalty, 0.0),
    ):
        if value != neutral:
            inputs[name] = _one(value, np.float32)
    words = [list(w) for w in sampling.stop_words_ids]
    if sampling.stop_token_ids is None:
        # "every EOS id of the model": TensorRT-LLM takes one end id; the others stop as one-token words
        eos = list(settings.model.eos_token_ids)
        end_id = eos[0] if eos else None
        words += [[t] for t in eos[1:] if [t] not in words]
    else:
        end_id = sampling.stop_token_ids[0] if sampling.stop_token_ids else None
        words += [[t] for t in sampling.stop_token_ids[1:] if [t] not in words]
    if end_id is not None:
        inputs["end_id"] = _one(end_id, np.int32)
    pad = tensors.get("pad_id")
    if pad is not None and np.asarray(pad).size:
        inputs["pad_id"] = _one(int(np.asarray(pad).reshape(-1)[0]), np.int32)
    if words:
        inputs["stop_words_list"] = to_word_list(words)[None]
    if sampling.bad_words_ids:
        inputs["bad_words_list"] = to_word_list(sampling.bad_words_ids)[None]
    if sampling.greedy:
        inputs["runtime_top_k"] = _one(1, np.int32)  # TensorRT-LLM's greedy: top-1
    else:
        inputs["temperature"] = _one(sampling.temperature, np.float32)
        if sampling.top_k:
            inputs["runtime_top_k"] = _one(sampling.top_k, np.int32)
        if sampling.top_p < 1.0:
            inputs["runtime_top_p"] = _one(sampling.top_p, np.float32)
    # ignore_eos: no EOS before max_tokens (TensorRT-LLM masks the end id below min_length)
    min_new = new_tokens if sampling.ignore_eos else max(sampling.min_tokens - continued, 0)
    if min_new:
        inputs["min_length"] = _one(min_new, np.int32)
    if sampling.seed is not None:
        inputs["random_seed"] = _one(sampling.seed, np.uint64)
    timeout = sampling.token_timeout_ms
    return EngineCall(
        inputs=inputs,
        request=request,
        max_tokens=max_tokens,
        token_timeout_ms=settings.engine.default_token_timeout_ms if timeout is None else timeout,
    )


def engine_stop_inputs() -> dict[str, np.ndarray]:
    """TensorRT-LLM's stop: `stop` for the request id the call carries (the
    backend's required inputs come along, as its own clients send them)."""
    return {
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": _one(1, np.int32),
        "request_output_len": _one(1, np.int32),
        "stop": _one(True, np.bool_),
    }


def engine_error_message(message: str) -> str:
    """An engine error as this stack words it: a full queue carries the contract's
    retryable `overloaded:` marker."""
    if any(marker in message for marker in _QUEUE_FULL):
        return f"{OVERLOADED_MARKER} {message}"
    return f"tensorrt_llm: {message}"


@dataclass(slots=True)
class BridgeReply:
    """One response of the `tensorrt_llm` step to its caller: data (`error` None)
    or an error; `final` ends the stream."""

    token_ids: list[int]
    final: bool
    finish_reason: str | None = None
    sequence_length: int = 0
    cum_log_probs: float = 0.0
    output_log_probs: list[float] = field(default_factory=list)
    error: str | None = None


class EngineStream:
    """One request's engine responses -> this step's replies. Called on the
    request's own thread, in order; `stop_reason` may be set from another
    thread (a keyed stop, the timeout watchdog) before the engine ends."""

    def __init__(self, call: EngineCall, clock: Callable[[], int] = time.time_ns) -> None:
        self.call = call
        self.clock = clock
        self.arrival_time_ns = clock()
        self.first_token_time_ns = 0
        self.last_token_time_ns = 0
        self.generated = 0  # new tokens, the continuation not included
        self.replied = False  # a data reply went out (the echo with it)
        self.done = False  # the final reply went out
        self.stop_reason: str | None = None
        self._lock = threading.Lock()
        self._ids: list[int] = []  # stream=false: everything so far
        self._logprobs: list[float] = []
        self._cum = 0.0

    @property
    def continued(self) -> int:
        return len(self.call.request.continuation_ids)

    @property
    def num_input_tokens(self) -> int:
        return len(self.call.request.prompt_token_ids)

    def request_stop(self, reason: str) -> bool:
        """Mark the request stopped (`cancelled`, `timeout`); False if it already was."""
        with self._lock:
            if self.stop_reason is not None or self.done:
                return False
            self.stop_reason = reason
            return True

    def _echo(self, ids: list[int]) -> list[int]:
        request = self.call.request
        if not request.exclude_input_in_output and not self.replied:
            return request.input_ids + ids
        return ids

    def on_response(
        self, token_ids: list[int], cum_log_prob: float | None, log_probs: list[float] | None
    ) -> BridgeReply | None:
        """A data response of the engine (new tokens only); None when it calls for no reply."""
        if self.done:
            return None
        if token_ids:
            now = self.clock()
            self.first_token_time_ns = self.first_token_time_ns or now
            self.last_token_time_ns = now
        self.generated += len(token_ids)
        if cum_log_prob is not None:
            self._cum = float(cum_log_prob)
        length = self.continued + self.generated >= self.call.max_tokens
        if not self.call.request.streaming:
            self._ids.extend(token_ids)
            self._logprobs.extend(log_probs or [])
            return self._final("length") if length and self.stop_reason is None else None
        if length and self.stop_reason is None:
            return self._final("length", token_ids, log_probs)
        ids = self._echo(token_ids)
        if not ids:
            return None
        self.replied = True
        return BridgeReply(ids, False, None, self.generated, self._cum, list(log_probs or []))

    def on_end(self) -> BridgeReply | None:
        """The engine's stream ended (its final response came)."""
        if self.done:
            return None
        if self.stop_reason is not None:
            reason = self.stop_reason
        else:
            reason = "length" if self.continued + self.generated >= self.call.max_tokens else "stop"
        return self._final(reason)

    def on_error(self, message: str) -> BridgeReply | None:
        if self.done:
            return None
        self.done = True
        return BridgeReply([], True, "error", self.generated, error=engine_error_message(message))

    def _final(
        self, reason: str, token_ids: list[int] | None = None, log_probs: list[float] | None = None
    ) -> BridgeReply:
        self.done = True
        if self.call.request.streaming:
            ids, lps = self._echo(list(token_ids or [])), list(log_probs or [])
        else:
            request = self.call.request
            ids = self._ids if request.exclude_input_in_output else request.input_ids + self._ids
            lps = self._logprobs
        self.replied = True
        return BridgeReply(ids, True, reason, self.generated, self._cum, lps)


def reply_arrays(stream: EngineStream, reply: BridgeReply, context: bytes, request_key: str) -> dict[str, np.ndarray]:
    """The LLM step's output arrays (python_llm's names and shapes, response_tensors.py)."""
    return {
        "output_ids": np.asarray([[reply.token_ids]], dtype=np.int32),
        "sequence_length": np.asarray([[reply.sequence_length]], dtype=np.int32),
        "cum_log_probs": np.asarray([[reply.cum_log_probs]], dtype=np.float32),
        "output_log_probs": np.asarray([[reply.output_log_probs]], dtype=np.float32),
        "finish_reason": np.asarray([[(reply.finish_reason or "").encode()]], dtype=np.object_),
        "num_input_tokens": np.asarray([[stream.num_input_tokens]], dtype=np.int32),
        "arrival_time_ns": np.asarray([[stream.arrival_time_ns]], dtype=np.int64),
        "first_token_time_ns": np.asarray([[stream.first_token_time_ns]], dtype=np.int64),
        "last_token_time_ns": np.asarray([[stream.last_token_time_ns]], dtype=np.int64),
        "request_context": np.asarray([[context]], dtype=np.object_),
        "request_key": np.asarray([[request_key.encode()]], dtype=np.object_),
    }


def engine_token_ids(array: np.ndarray | None) -> list[int]:
    """The engine's `output_ids` ([1, beam 1, n]), padding (-1) dropped."""
    if array is None:
        return []
    values = np.asarray(array).reshape(-1)
    return [int(v) for v in values.tolist() if v >= 0]


def engine_log_probs(cum: np.ndarray | None, per_token: np.ndarray | None) -> tuple[float | None, list[float]]:
    first = None if cum is None or np.asarray(cum).size == 0 else float(np.asarray(cum).reshape(-1)[0])
    values = [] if per_token is None else [float(v) for v in np.asarray(per_token).reshape(-1).tolist()]
    return first, values


class Deadlines:
    """Per-token timeouts: the watchdog asks which requests have waited too long
    for their next token (`token_timeout_ms` after the last one, or after arrival)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._due: dict[str, tuple[float, float]] = {}  # id -> (deadline, timeout_s)

    def start(self, request_id: str, timeout_ms: int) -> None:
        if timeout_ms > 0:
            with self._lock:
                self._due[request_id] = (self._clock() + timeout_ms / 1000.0, timeout_ms / 1000.0)

    def touch(self, request_id: str) -> None:
        with self._lock:
            entry = self._due.get(request_id)
            if entry is not None:
                self._due[request_id] = (self._clock() + entry[1], entry[1])

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._due.pop(request_id, None)

    def expired(self) -> list[str]:
        """The overdue ids, each reported once."""
        now = self._clock()
        with self._lock:
            late = [rid for rid, (deadline, _) in self._due.items() if deadline <= now]
            for rid in late:
                del self._due[rid]
        return late
