"""How a Triton HTTP body's refusal names the field (gateway/triton/body_json.py;
the strict JSON itself: test_strict_json.py), the engine refusals as 400s
naming the field (gateway/upstream.map_error), and the one table of value
rules (contract/public_bounds.py) that the gateway, the client library and the
engine share."""

from __future__ import annotations

import re

import pytest

from client import GenerationOptions, RequestError
from contract.errors import InvalidInputError
from contract.public_bounds import BOUNDS, bound_problem, check_bound
from gateway.core.errors import GatewayError
from gateway.core.upstream import map_error
from gateway.triton.body_json import parse
from python_llm.engine.core.sampling_params import InvalidRequestError, SamplingParams


def refusal(raw: bytes) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(raw)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"te\xffxt": 1}', "te\\udcffxt: the field name is not valid UTF-8"),
        (b'{"text_input": "a\\ud800b"}', "text_input: not valid UTF-8"),
        (
            b'{"stop_words": ["ok", "\xc3"]}',
            "stop_words: not valid UTF-8 (an invalid byte or a lone surrogate) (at stop_words[1])",
        ),
        (b'{"temperature": NaN}', "temperature: NaN is not a JSON number"),
        (b'{"top_p": 1e999}', "top_p: 1e999 is out of range"),
        (b'{"seed": ' + b"9" * 5000 + b"}", "seed: an integer of 5000 digits is out of range"),
        (b'{"max_tokens": 1, "max_tokens": 2}', "max_tokens: given more than once in one JSON object"),
        (
            b'{"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["\xfe"]}]}',
            "text_input: not valid UTF-8 (an invalid byte or a lone surrogate) (at inputs[0].data[0])",
        ),
        (
            b'{"inputs": [{"name": "top_k", "datatype": "INT32", "shape": [1], "data": [1], "data": [2]}]}',
            "top_k: given more than once in one JSON object (at inputs[0].data)",
        ),
        (
            b'{"inputs": [{"name": "\xfe", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}',
            "inputs[0].name: not valid UTF-8",
        ),
        (
            b'{"outputs": [{"name": "\xfe"}, {"name": "text_output", "parameters": {"binary_data": NaN}}]}',
            "outputs[0].name: not valid UTF-8",
        ),
        (b"NaN", "body: NaN is not a JSON number"),
    ],
)
def test_a_refusal_names_the_top_level_key_or_the_tensor(raw: bytes, message: str) -> None:
    error = refusal(raw)
    assert error.message.startswith(message), error.message
    assert error.param == message.split(":")[0]


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a": }'])
def test_a_body_that_is_not_json_is_a_400(raw: bytes) -> None:
    assert refusal(raw).message.startswith("The body is not valid JSON: ")


def test_numbers_stay_as_written() -> None:
    assert parse(b'{"max_tokens": 2.0, "seed": 2}') == {"max_tokens": 2.0, "seed": 2}
    assert isinstance(parse(b'{"max_tokens": 2.0}')["max_tokens"], float)


@pytest.mark.parametrize(
    "message, param, shown",
    [
        (
            "in ensemble 'ensemble', length_penalty (len_penalty): 2.0 applies to beam search only",
            "length_penalty",
            "length_penalty (len_penalty): 2.0 applies",
        ),
        ("in ensemble 'ensemble', messages: item 0 has role 'wizard'", "messages", "messages: item 0"),
        ("[request id: gw-1] input_ids: 9000 tokens leave no room to generate", "prompt", "input_ids: 9000"),
        ("runtime_top_k: must be >= 0, got -1", "top_k", "runtime_top_k: must be"),
        (
            "in ensemble 'ensemble', continuation_ids: 6 ids leave nothing to generate",
            "continuation_ids",
            "continuation_ids: 6 ids",
        ),
    ],
)
def test_an_engine_refusal_naming_a_field_is_a_400_keeping_its_message(message: str, param: str, shown: str) -> None:
    error = map_error(RequestError(message))
    assert (error.status, error.param) == (400, param)
    assert error.message.startswith(shown)


@pytest.mark.parametrize(
    "message",
    [
        "Stream removed",
        "model 'ensemble' is not ready",
        "in ensemble 'ensemble', Failed to process the request: error: boom",
    ],
)
def test_an_engine_failure_naming_no_field_stays_a_502(message: str) -> None:
    assert map_error(RequestError(message)).status == 502


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("top_p", 0.0, "must be in (0, 1], got 0.0"),
        ("top_p", 1.5, "must be in (0, 1], got 1.5"),
        ("temperature", -0.5, "must be >= 0, got -0.5"),
        ("repetition_penalty", 0, "must be > 0, got 0"),
        ("length_penalty", 1.5, "1.5 applies to beam search only"),
        ("max_tokens", 0, "must be >= 1, got 0"),
        ("max_tokens", 2.5, "must be an integer, got 2.5"),
        ("presence_penalty", float("nan"), "must be a finite number, got nan"),
        ("seed", 2**64, f"must be in [0, {2**64 - 1}], got {2**64}"),
    ],
)
def test_the_value_rules_name_what_is_wrong(name: str, value: object, problem: str) -> None:
    assert (bound_problem(name, value) or "").startswith(problem)
    with pytest.raises(InvalidInputError, match=f"^{name}: "):
        check_bound(name, value)


@pytest.mark.parametrize(
    "name, value",
    [
        ("top_p", 1.0),
        ("temperature", 0),
        ("length_penalty", 1.0),
        ("token_timeout_ms", 0),
        ("seed", 2**64 - 1),
        ("max_tokens", None),
    ],
)
def test_values_inside_the_rules_pass(name: str, value: object) -> None:
    assert bound_problem(name, value) is None


@pytest.mark.parametrize(
    "name, value",
    [("top_p", 1.5), ("repetition_penalty", 0.0), ("min_tokens", -1), ("token_timeout_ms", -1), ("temperature", -1.0)],
)
def test_the_client_and_the_engine_refuse_what_the_table_refuses(name: str, value: object) -> None:
    assert name in BOUNDS
    with pytest.raises(ValueError, match=f"^{re.escape(f'{name}: {bound_problem(name, value)}')}$"):
        GenerationOptions(**{name: value})
    with pytest.raises(InvalidRequestError, match=f"^{name}: "):
        SamplingParams(**{name: value}).validate()
