"""The LLM step's response read into an LLMResponse (one parser for `llm_bls`
and `postprocessing`), and the public arrays built from it."""

from __future__ import annotations

import numpy as np
import pytest

from contract.errors import InvalidInputError
from ensemble.outbound.public_outputs import (
    LLM_RESPONSE_OUTPUTS,
    ArrayGetter,
    LLMResponse,
    ReturnFlags,
    llm_response_from,
    public_output_arrays,
)
from ensemble.request_context import RequestContext


def _getter(arrays: dict[str, np.ndarray]) -> ArrayGetter:
    return arrays.get


def _step_arrays(finish_reason: object = b"stop") -> dict[str, np.ndarray]:
    """What the LLM step sends (backends/python_llm/response_tensors.py): batch, then beam."""
    return {
        "output_ids": np.asarray([[[11, 12, 13]]], dtype=np.int32),
        "sequence_length": np.asarray([[7]], dtype=np.int32),
        "cum_log_probs": np.asarray([[-1.5]], dtype=np.float32),
        "output_log_probs": np.asarray([[[-0.5, -0.25, -0.75]]], dtype=np.float32),
        "finish_reason": np.asarray([[finish_reason]], dtype=np.object_),
        "num_input_tokens": np.asarray([[5]], dtype=np.int32),
        "arrival_time_ns": np.asarray([[100]], dtype=np.int64),
        "first_token_time_ns": np.asarray([[200]], dtype=np.int64),
        "last_token_time_ns": np.asarray([[300]], dtype=np.int64),
    }


def test_every_field_is_read() -> None:
    arrays = _step_arrays()
    response = llm_response_from(_getter(arrays))
    assert response.token_ids == [11, 12, 13]
    assert response.sequence_length == 7
    assert response.finish_reason == "stop"
    assert response.num_input_tokens == 5
    assert response.times_ns == (100, 200, 300)
    assert response.cum_log_probs is arrays["cum_log_probs"]
    assert response.output_log_probs is arrays["output_log_probs"]
    assert [
        type(v) for v in (*response.token_ids, response.sequence_length, response.num_input_tokens, *response.times_ns)
    ] == [int] * 8


def test_the_parsed_outputs_are_the_ones_llm_bls_asks_for() -> None:
    asked: list[str] = []

    def get(name: str) -> np.ndarray | None:
        asked.append(name)
        return None

    llm_response_from(get)
    assert sorted(set(asked)) == sorted(LLM_RESPONSE_OUTPUTS)


def test_absent_optional_outputs_read_as_zero_values() -> None:
    response = llm_response_from(_getter({"output_ids": np.asarray([[[4]]], dtype=np.int32)}))
    assert response == LLMResponse(
        token_ids=[4],
        sequence_length=0,
        finish_reason=None,
        num_input_tokens=0,
        cum_log_probs=None,
        output_log_probs=None,
        times_ns=(0, 0, 0),
    )
    assert llm_response_from(_getter({})) == LLMResponse(
        token_ids=[], sequence_length=0, finish_reason=None, times_ns=(0, 0, 0)
    )


def test_empty_arrays_read_like_absent_ones() -> None:
    arrays = {
        name: np.zeros((1, 0), dtype=np.int64) for name in ("sequence_length", "num_input_tokens", "arrival_time_ns")
    }
    arrays["finish_reason"] = np.zeros((1, 0), dtype=np.object_)
    arrays["output_ids"] = np.zeros((1, 1, 0), dtype=np.int32)
    response = llm_response_from(_getter(arrays))
    assert (
        response.token_ids,
        response.sequence_length,
        response.finish_reason,
        response.num_input_tokens,
        response.times_ns,
    ) == ([], 0, None, 0, (0, 0, 0))


@pytest.mark.parametrize("reason", [b"length", "length", np.str_("length")])
def test_finish_reason_as_bytes_or_str(reason: object) -> None:
    assert llm_response_from(_getter(_step_arrays(reason))).finish_reason == "length"


@pytest.mark.parametrize("reason", [b"", ""])
def test_an_empty_finish_reason_means_not_finished(reason: object) -> None:
    assert llm_response_from(_getter(_step_arrays(reason))).finish_reason is None


def test_a_finish_reason_that_is_not_utf8_names_the_field() -> None:
    with pytest.raises(InvalidInputError, match=r"^finish_reason: not valid UTF-8 \(byte 0: invalid start byte\)$"):
        llm_response_from(_getter(_step_arrays(b"\xffstop")))


@pytest.mark.parametrize(
    "ids",
    [np.asarray([[[1, 2]]]), np.asarray([[1, 2]]), np.asarray([1, 2])],
    ids=["batch-beam-tokens", "batch-tokens", "tokens"],
)
def test_token_ids_with_or_without_batch_and_beam_dims(ids: np.ndarray) -> None:
    assert llm_response_from(_getter({"output_ids": ids.astype(np.int32)})).token_ids == [1, 2]


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 1, 3), (2, 3)])
def test_more_than_one_sequence_is_refused_rather_than_run_together(shape: tuple[int, ...]) -> None:
    ids = np.zeros(shape, dtype=np.int32)
    with pytest.raises(
        InvalidInputError,
        match=rf"^output_ids: one sequence per response expected, got shape "
        rf"\[{', '.join(map(str, shape))}\]$",
    ):
        llm_response_from(_getter({"output_ids": ids}))


def test_public_arrays_carry_only_what_was_asked_for() -> None:
    response = llm_response_from(_getter(_step_arrays()))
    plain = public_output_arrays("Hi", "stop", response, ReturnFlags(), "k" * 32)
    assert plain["text_output"].tolist() == [[b"Hi"]]
    assert plain["finish_reason"].tolist() == [[b"stop"]]
    assert plain["request_key"].tolist() == [[b"k" * 32]]
    assert plain["num_input_tokens"].tolist() == [[5]] and plain["num_output_tokens"].tolist() == [[3]]
    assert plain["output_ids"].shape == (1, 0)
    assert plain["cum_log_probs"].shape == (1, 0) and plain["output_log_probs"].shape == (1, 0, 0)
    assert [plain[n].tolist() for n in ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns")] == [
        [[0]],
        [[0]],
        [[0]],
    ]

    full = public_output_arrays(
        "Hi", None, response, ReturnFlags(log_probs=True, perf_metrics=True, output_ids=True), "k" * 32
    )
    assert full["finish_reason"].tolist() == [[b""]]
    assert full["output_ids"].tolist() == [[11, 12, 13]]
    assert full["cum_log_probs"].tolist() == [[-1.5]]
    assert full["output_log_probs"].tolist() == [[[-0.5, -0.25, -0.75]]]
    assert [full[n].tolist() for n in ("arrival_time_ns", "first_token_time_ns", "last_token_time_ns")] == [
        [[100]],
        [[200]],
        [[300]],
    ]


def test_return_flags_are_the_ones_packed_in_the_request_context() -> None:
    context = RequestContext(key="k" * 32, return_log_probs=True, return_output_ids=True)
    assert ReturnFlags.of(context) == ReturnFlags(log_probs=True, perf_metrics=False, output_ids=True)
    assert ReturnFlags.of(RequestContext(key="k" * 32, return_perf_metrics=True)) == ReturnFlags(perf_metrics=True)
