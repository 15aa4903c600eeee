"""`llm_bls`'s flow (ensemble/bls_flow.py) driven with fakes for the LLM step,
the stop request and the response sender: what reaches the client, when the
engine request is stopped, and how each way of ending is reported."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from tokenizers import Tokenizer

from ensemble.bls_flow import BLSCallbacks, LLMStepError, run_bls_request
from ensemble.inbound.llm_request import EngineMaxTokens, LLMRequestBuilder
from ensemble.inbound.prompt import PromptBuilder
from ensemble.outbound.public_outputs import LLMResponse
from ensemble.outbound.shared_state import InProcessStateStore
from ensemble.outbound.stream_postprocessor import StreamPostprocessor
from ensemble.tokenizer_info import TokenizerInfo

KEY = "bls-test-key-" + "x" * 24
Arrays = dict[str, np.ndarray]


@pytest.fixture
def builder(tokenizer_info: TokenizerInfo) -> LLMRequestBuilder:
    return LLMRequestBuilder(
        tokenizer_info, PromptBuilder(tokenizer_info), EngineMaxTokens(default_max_tokens=128, max_tokens_limit=4096)
    )


@pytest.fixture
def post(tokenizer: Tokenizer) -> StreamPostprocessor:
    return StreamPostprocessor(tokenizer, InProcessStateStore())


def _inputs(**values: object) -> dict[str, np.ndarray]:
    """Public request tensors as Triton hands them over: [1, n], STRING as bytes."""
    arrays = {}
    for name, value in values.items():
        items = value if isinstance(value, list) else [value]
        if all(isinstance(v, str) for v in items):
            arrays[name] = np.asarray([[v.encode() for v in items]], dtype=np.object_)
        else:
            arrays[name] = np.asarray([items])
    return arrays


@dataclass
class FakeLLM:
    """Scripted LLM step: one response per entry of `steps` (token ids, finish reason)."""

    steps: list[tuple[list[int], str | None]]
    error_after: int | None = None  # raise LLMStepError after this many responses
    cancel_after: int | None = None  # the client goes away after this many responses
    calls: list[Arrays] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    sent: list[tuple[Arrays, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    yielded: int = 0

    def call_llm(self, inputs: Arrays) -> Iterator[LLMResponse]:
        self.calls.append(inputs)
        length = 0
        for index, (ids, reason) in enumerate(self.steps):
            if self.error_after is not None and index == self.error_after:
                raise LLMStepError("python_llm: engine failed")
            length += len(ids)
            self.yielded += 1
            yield LLMResponse(
                token_ids=ids,
                sequence_length=length,
                finish_reason=reason,
                num_input_tokens=3,
                cum_log_probs=np.asarray([[-0.5]], dtype=np.float32),
                output_log_probs=np.asarray([[[-0.5] * len(ids)]], dtype=np.float32),
                times_ns=(1, 2, 3),
            )

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and self.yielded > self.cancel_after

    def callbacks(self) -> BLSCallbacks:
        return BLSCallbacks(
            self.call_llm,
            self.stops.append,
            lambda arrays, final: self.sent.append((arrays, final)),
            self.errors.append,
            self.is_cancelled,
        )

    def texts(self) -> list[str]:
        return [arrays["text_output"][0, 0].decode() for arrays, _ in self.sent]

    def reasons(self) -> list[str]:
        return [arrays["finish_reason"][0, 0].decode() for arrays, _ in self.sent]

    def finals(self) -> list[bool]:
        return [final for _, final in self.sent]


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _one_per_step(ids: list[int], last_reason: str = "length") -> list[tuple[list[int], str | None]]:
    return [([token], None) for token in ids[:-1]] + [([ids[-1]], last_reason)]


def test_a_stream_reaches_the_client_delta_by_delta_with_the_engine_reason(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    ids = _ids(tokenizer, "Paris is nice.")
    llm = FakeLLM(_one_per_step(ids))
    ended = run_bls_request(
        _inputs(text_input="Capital?", stream=True, request_key=KEY).get, builder, post, llm.callbacks()
    )
    assert ended == "length"
    assert "".join(llm.texts()) == "Paris is nice."
    assert len(llm.sent) == len(ids)
    assert llm.finals() == [False] * (len(ids) - 1) + [True]
    assert llm.reasons() == [""] * (len(ids) - 1) + ["length"]
    assert llm.stops == [] and llm.errors == []
    assert [arrays["request_key"][0, 0] for arrays, _ in llm.sent] == [KEY.encode()] * len(ids)
    (call,) = llm.calls
    assert call["request_key"].tolist() == [[KEY.encode()]]
    assert call["streaming"].tolist() == [[True]]
    assert call["request_output_len"].tolist() == [[128]]


def test_a_minted_key_is_the_one_sent_to_the_llm_step_and_the_client(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    llm = FakeLLM([(_ids(tokenizer, "Hi"), "stop")])
    run_bls_request(_inputs(text_input="Hello").get, builder, post, llm.callbacks())
    minted = llm.calls[0]["request_key"][0, 0]
    assert len(minted) == 32
    assert [arrays["request_key"][0, 0] for arrays, _ in llm.sent] == [minted]


def test_a_stop_string_stops_the_engine_once_and_reports_stop(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    ids = _ids(tokenizer, "The answer is 42.\nUser: and more text")
    llm = FakeLLM(_one_per_step(ids))
    ended = run_bls_request(
        _inputs(text_input="Q", stream=True, stop_words=["User:"], request_key=KEY).get, builder, post, llm.callbacks()
    )
    assert ended == "stop"
    assert "".join(llm.texts()) == "The answer is 42.\n"
    assert llm.stops == [KEY]
    assert llm.reasons()[-1] == "stop" and llm.finals()[-1] is True
    # every response before the one completing "User:" is forwarded (the one
    # holding "User" with empty text); after it only the engine's final one
    completes = [tokenizer.decode([token]) for token in ids].index(":")
    assert llm.finals() == [False] * completes + [True]
    assert llm.texts()[completes - 1 :] == ["", ""]


def test_segment_and_return_flags_are_applied(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    ids = _ids(tokenizer, "One. Two. Three")
    llm = FakeLLM([([token], None) for token in ids] + [([], "stop")])
    run_bls_request(
        _inputs(
            text_input="Q", segment="sentence", return_output_ids=True, return_log_probs=True, return_perf_metrics=True
        ).get,
        builder,
        post,
        llm.callbacks(),
    )
    assert [t for t in llm.texts() if t] == ["One.", " Two.", " Three"]
    last, _ = llm.sent[-2]
    assert last["output_ids"].tolist() == [[ids[-1]]]
    assert last["output_log_probs"].tolist() == [[[-0.5]]]
    assert last["cum_log_probs"].tolist() == [[-0.5]]
    assert last["first_token_time_ns"].tolist() == [[2]]


def test_without_return_flags_ids_log_probs_and_times_stay_empty(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    llm = FakeLLM([(_ids(tokenizer, "Hi"), "stop")])
    run_bls_request(_inputs(text_input="Q").get, builder, post, llm.callbacks())
    ((arrays, final),) = llm.sent
    assert final is True
    assert arrays["output_ids"].shape == (1, 0) and arrays["cum_log_probs"].shape == (1, 0)
    assert arrays["output_log_probs"].shape == (1, 0, 0) and arrays["first_token_time_ns"].tolist() == [[0]]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (_inputs(segment="word"), "text_input: required"),
        (_inputs(text_input="Q", segment="word"), "segment: must be one of token, sentence, paragraph; got 'word'"),
        (_inputs(text_input="Q", stop_words=[""]), "stop_words: item 0 is empty"),
    ],
)
def test_invalid_input_is_one_error_and_no_llm_call(
    builder: LLMRequestBuilder, post: StreamPostprocessor, inputs: Arrays, message: str
) -> None:
    llm = FakeLLM([])
    assert run_bls_request(inputs.get, builder, post, llm.callbacks()) == "error"
    assert llm.errors == [message]
    assert llm.calls == [] and llm.sent == []


def test_a_cancelled_client_stops_the_engine_and_gets_a_cancelled_final(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    ids = _ids(tokenizer, "a b c d e f")
    llm = FakeLLM(_one_per_step(ids, "cancelled"), cancel_after=2)
    ended = run_bls_request(_inputs(text_input="Q", stream=True, request_key=KEY).get, builder, post, llm.callbacks())
    assert ended == "cancelled"
    assert llm.stops == [KEY]
    assert llm.finals() == [False, False, True]  # drained until the engine's final response
    assert llm.texts()[-1] == "" and llm.reasons()[-1] == "cancelled"
    assert llm.errors == []


def test_a_cancelled_client_whose_stream_ends_without_a_final_gets_nothing_more(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    llm = FakeLLM([([token], None) for token in _ids(tokenizer, "a b c")], cancel_after=1)
    assert run_bls_request(_inputs(text_input="Q").get, builder, post, llm.callbacks()) == "cancelled"
    assert len(llm.stops) == 1 and llm.finals() == [False] and llm.errors == []


def test_an_llm_step_error_reaches_the_client(
    builder: LLMRequestBuilder, post: StreamPostprocessor, tokenizer: Tokenizer
) -> None:
    llm = FakeLLM(_one_per_step(_ids(tokenizer, "a b c")), error_after=1)
    assert run_bls_request(_inputs(text_input="Q").get, builder, post, llm.callbacks()) == "error"
    assert llm.errors == ["python_llm: engine failed"]
    assert llm.finals() == [False]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([], "llm_bls: the LLM step returned nothing"),
        ([([42], None)], "llm_bls: the LLM step ended the stream without a final response"),
    ],
)
def test_a_stream_without_a_final_response_ends_in_an_error(
    builder: LLMRequestBuilder, post: StreamPostprocessor, steps: list, message: str
) -> None:
    llm = FakeLLM(steps)
    assert run_bls_request(_inputs(text_input="Q").get, builder, post, llm.callbacks()) == "error"
    assert llm.errors == [message]
