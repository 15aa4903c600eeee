"""The one validator of the public inputs (gateway/triton/inputs.py), through
the generate JSON decoder (wire_json.generate_inputs) and with hand-made wire
inputs: every refusal a 400 naming the input; the tier's priority and
max_tokens cap; the gateway's request id; output ids always asked for."""

from __future__ import annotations

import json

import pytest

from contract.public_tensors import PUBLIC_INPUTS
from gateway.config import TierConfig
from gateway.core.errors import GatewayError
from gateway.triton.inputs import SPECS, ValidatedCall, WireInput, validate, wire_datatype
from gateway.triton.wire_json import generate_inputs

TIER = TierConfig(priority=7, max_tokens_cap=16)
GOOD_KEY = "A" * 40


def generate(body: dict, *, stream_refusal: str | None = None, tier: TierConfig = TIER) -> ValidatedCall:
    inputs, caller_id = generate_inputs(body)
    return validate(
        "ensemble", inputs, tier=tier, request_id="gw-1", caller_id=caller_id, stream_refusal=stream_refusal
    )


def refused(body: dict, **kwargs: object) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        generate(body, **kwargs)
    assert caught.value.status == 400
    return caught.value


def wire(name: str, shape: tuple[int, ...], values: list, datatype: str | None = None) -> WireInput:
    return WireInput(name, datatype or wire_datatype(SPECS[name]), shape, lambda: values)


def test_the_specs_are_the_public_inputs_with_wire_datatypes():
    assert list(SPECS) == [spec.name for spec in PUBLIC_INPUTS]
    assert {wire_datatype(s) for s in PUBLIC_INPUTS} == {"BYTES", "INT32", "FP32", "UINT64", "BOOL"}
    assert wire_datatype(SPECS["text_input"]) == "BYTES" and wire_datatype(SPECS["seed"]) == "UINT64"


def test_a_good_request_becomes_options_under_the_tier():
    call = generate(
        {
            "text_input": "Hi",
            "max_tokens": 100,
            "temperature": 0.5,
            "priority": 99,
            "id": "mine",
            "stop_words": ["a", "b"],
            "seed": 2**63,
            "stream": True,
            "request_key": GOOD_KEY,
            "messages": json.dumps([{"role": "user", "content": "Q"}]),
        }
    )
    options = call.options
    assert call.text_input == "Hi" and call.streaming is True and call.caller_id == "mine"
    assert options.max_tokens == 16 and options.priority == 7  # capped; the tier's priority
    assert options.request_id == "gw-1" and options.request_key == GOOD_KEY
    assert options.temperature == 0.5 and options.stop_words == ["a", "b"] and options.seed == 2**63
    assert options.messages == [{"role": "user", "content": "Q"}]
    # ids always asked for (token accounting), the caller's wish kept for the rendering
    assert options.return_output_ids is True and call.return_output_ids is False
    # not sent unless the caller sent them (GenerationOptions would default them to True)
    assert options.return_num_input_tokens is None and options.return_num_output_tokens is None
    assert call.prompt_bytes == len("Hi") + len("Q")


def test_defaults_and_what_means_none():
    call = generate(
        {"text_input": "Hi", "request_key": "", "stop_words": [], "return_output_ids": True}, tier=TierConfig()
    )
    assert call.streaming is False and call.caller_id is None and call.return_output_ids is True
    assert call.options.request_key is None  # the client library mints one
    assert call.options.stop_words is None and call.options.max_tokens is None and call.options.priority == 0


def test_messages_without_text_and_empty_text_without_messages():
    call = generate({"text_input": "", "messages": '[{"role": "user", "content": "Q"}]'})
    assert call.text_input == "" and call.options.messages == [{"role": "user", "content": "Q"}]
    assert refused({"text_input": ""}).message == "text_input: must not be empty unless messages are given"
    assert refused({"max_tokens": 4}).message == "text_input: required"


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text_input": "x", "foo": 1}, "foo: unknown input; the inputs are text_input, messages,"),
        ({"text_input": "x", "max_tokens": "4"}, "max_tokens: expected an integer (INT32), got a string"),
        ({"text_input": "x", "max_tokens": 4.5}, "max_tokens: expected an integer (INT32), got a number"),
        ({"text_input": "x", "max_tokens": True}, "max_tokens: expected an integer (INT32), got a boolean"),
        ({"text_input": "x", "max_tokens": 2**31}, "max_tokens: 2147483648 is out of the INT32 range"),
        ({"text_input": "x", "max_tokens": 0}, "max_tokens: must be >= 1, got 0"),
        ({"text_input": "x", "seed": -1}, "seed: -1 is out of the UINT64 range"),
        ({"text_input": "x", "temperature": float("nan")}, "temperature: nan is not a finite FP32 number"),
        ({"text_input": "x", "temperature": 1e39}, "temperature: 1e+39 is not a finite FP32 number"),
        ({"text_input": "x", "temperature": -1}, "temperature: must be >= 0, got -1.0"),
        ({"text_input": "x", "top_p": 2}, "top_p: must be in (0, 1], got 2.0"),
        ({"text_input": "x", "repetition_penalty": 0}, "repetition_penalty: must be > 0, got 0.0"),
        ({"text_input": "x", "length_penalty": 1.5}, "length_penalty: 1.5 applies to beam search only"),
        ({"text_input": "x", "token_timeout_ms": -1}, "token_timeout_ms: must be >= 0, got -1"),
        ({"text_input": "x", "stream": 1}, "stream: expected a boolean (BOOL), got an integer"),
        ({"text_input": 5}, "text_input: expected a string (BYTES), got an integer"),
        ({"text_input": "\ud800"}, "text_input: not valid UTF-8 (a lone surrogate)"),
        ({"text_input": "x", "segment": "word"}, "segment: must be one of ('token', 'sentence', 'paragraph')"),
        ({"text_input": "x", "stop_words": ["a", ""]}, "stop_words: item 1 is empty"),
        ({"text_input": "x", "stop_words": ["a" * 257]}, "stop_words: item 0 is longer than 256 characters"),
        ({"text_input": "x", "bad_words": ["w"] * 65}, "bad_words: 65 words; at most 64"),
        ({"text_input": "x", "stop_words": [["a"]]}, "stop_words: must be a value or a flat list of values"),
        ({"text_input": "x", "max_tokens": [1, 2]}, "max_tokens: shape [2] is not [1] or [1, 1] (one value)"),
        ({"text_input": "x", "max_tokens": []}, "max_tokens: shape [0] is not [1] or [1, 1] (one value)"),
        ({"text_input": "", "messages": "[{"}, "messages: not valid JSON"),
        ({"text_input": "", "messages": '{"role": "user"}'}, "messages: must be a JSON array"),
        ({"text_input": "", "messages": "[" * 40 + "]" * 40}, "messages: JSON nested deeper than 16 levels"),
        (
            {"text_input": "", "messages": '[{"role": "user", "content": 5}]'},
            "messages: messages[0] must be a dict with string 'role' and 'content'",
        ),
        ({"text_input": "x", "id": 5}, "id: must be a string, got an integer"),
    ],
)
def test_refusals_name_the_input(body, message):
    error = refused(body)
    assert error.message.startswith(message), error.message
    assert error.param == message.split(":")[0]


def test_a_malformed_request_key_is_refused_without_repeating_it():
    error = refused({"text_input": "x", "request_key": "short-secret"})
    assert error.param == "request_key" and "short-secret" not in error.message
    assert error.message.startswith("request_key: must be 32 to 128 characters")


def test_stream_true_on_a_route_that_answers_once():
    error = refused({"text_input": "x", "stream": True}, stream_refusal="must be false here")
    assert (error.message, error.param) == ("stream: must be false here", "stream")
    assert generate({"text_input": "x", "stream": False}, stream_refusal="must be false here").streaming is False


def test_unknown_names_are_bounded_in_the_message():
    error = refused({"text_input": "x", "z" * 500: 1})
    assert len(error.message) < 600 and error.message.startswith("z" * 64 + "...: unknown input")


@pytest.mark.parametrize(
    "shape, values, ok",
    [
        ((1,), ["x"], True),
        ((1, 1), ["x"], True),
        ((2,), ["x", "y"], False),
        ((2, 1), ["x", "y"], False),
        ((1, 1, 1), ["x"], False),
        ((), ["x"], False),
        ((1, -1), ["x"], False),
    ],
)
def test_scalar_shapes(shape, values, ok):
    inputs = [wire("text_input", shape, values)]
    if ok:
        assert validate("ensemble", inputs, tier=TIER, request_id="r").text_input == "x"
    else:
        with pytest.raises(GatewayError) as caught:
            validate("ensemble", inputs, tier=TIER, request_id="r")
        assert caught.value.message.startswith("text_input: ")


def test_word_list_shapes_and_batches():
    ok = [wire("text_input", (1, 1), [b"x"]), wire("stop_words", (1, 2), [b"a", b"b"])]
    assert validate("ensemble", ok, tier=TIER, request_id="r").options.stop_words == ["a", "b"]
    flat = [wire("text_input", (1,), [b"x"]), wire("stop_words", (2,), [b"a", b"b"])]
    assert validate("ensemble", flat, tier=TIER, request_id="r").options.stop_words == ["a", "b"]
    for shape, message in (
        ((2, 1), "stop_words: batch size must be 1 (shape [2, 1])"),
        ((1, 1, 2), "stop_words: shape [1, 1, 2] is not [n] or [1, n]"),
        ((1, 3), "stop_words: shape [1, 3] holds 3 value(s), got 2"),
    ):
        with pytest.raises(GatewayError) as caught:
            validate("ensemble", [ok[0], wire("stop_words", shape, [b"a", b"b"])], tier=TIER, request_id="r")
        assert caught.value.message == message


def test_datatype_duplicates_and_bad_bytes():
    text = wire("text_input", (1, 1), [b"x"])
    cases = [
        ([text, wire("max_tokens", (1, 1), [4], "INT64")], "max_tokens: datatype INT64 is not INT32"),
        ([text, wire("text_input", (1, 1), [b"y"])], "text_input: given more than once"),
        ([wire("text_input", (1, 1), [b"\xff\xfe"])], "text_input: not valid UTF-8 (byte 0: invalid start byte)"),
        (
            [text, WireInput("max_tokens", "INT32", (1, 1), lambda: (_ for _ in ()).throw(ValueError("broken")))],
            "max_tokens: broken",
        ),
    ]
    for inputs, message in cases:
        with pytest.raises(GatewayError) as caught:
            validate("ensemble", inputs, tier=TIER, request_id="r")
        assert caught.value.message == message and caught.value.param == message.split(":")[0]


def test_values_are_decoded_only_after_name_datatype_and_shape_pass():
    decoded: list[str] = []

    def values(name: str):
        def decode():
            decoded.append(name)
            return [b"x"]

        return decode

    with pytest.raises(GatewayError):
        validate("ensemble", [WireInput("nope", "BYTES", (1,), values("nope"))], tier=TIER, request_id="r")
    with pytest.raises(GatewayError):
        validate("ensemble", [WireInput("text_input", "FP32", (1,), values("text_input"))], tier=TIER, request_id="r")
    with pytest.raises(GatewayError):
        validate("ensemble", [WireInput("text_input", "BYTES", (3,), values("text_input"))], tier=TIER, request_id="r")
    assert decoded == []
