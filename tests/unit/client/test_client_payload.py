"""Wire-format helpers: generate JSON, gRPC tensors, and parsing of both."""

from __future__ import annotations

import json

import numpy as np
import pytest

from client import GenerationOptions
from client.grpc_transport import build_inputs
from client.payload import (
    INPUT_DATATYPES,
    event_from_outputs,
    generate_body,
    grpc_tensors,
    input_values,
    stop_generate_body,
    stop_values,
)
from client.sse_transport import error_message


def test_grpc_tensors_have_a_batch_dim_and_contract_datatypes():
    values = input_values("héllo", GenerationOptions(max_tokens=3, seed=2**40, top_p=0.9, bad_words=["x"]))
    tensors = {name: (dt, arr) for name, dt, arr in grpc_tensors(values)}
    assert tensors["text_input"][0] == "BYTES" and tensors["text_input"][1].tolist() == [["héllo".encode()]]
    assert tensors["seed"][0] == "UINT64" and tensors["seed"][1].dtype == np.uint64
    assert tensors["seed"][1][0, 0] == 2**40
    assert tensors["top_p"][1].dtype == np.float32 and tensors["max_tokens"][1].shape == (1, 1)
    assert tensors["bad_words"][1].shape == (1, 1) and tensors["stream"][1].dtype == np.bool_
    assert tensors["return_num_output_tokens"][1][0, 0]


def test_messages_are_a_json_string_input():
    messages = [{"role": "system", "content": "简洁"}, {"role": "user", "content": "hi"}]
    body = generate_body(input_values("", GenerationOptions(messages=messages)), "id-1")
    assert body["id"] == "id-1" and json.loads(body["messages"]) == messages
    assert "简洁" in body["messages"]  # kept readable, not \\u-escaped


KEY = "k" * 20 + "_-" + "0123456789"  # 32 characters of the key alphabet


def test_stop_body_is_the_tensorrt_llm_stop_request_plus_the_request_key():
    assert stop_generate_body("r9", KEY) == {
        "input_ids": [0],
        "input_lengths": [1],
        "request_output_len": [1],
        "stop": True,
        "request_key": KEY,
        "id": "r9",
    }


def test_stop_tensors_carry_the_request_key_as_a_batched_string():
    values = stop_values(KEY)
    assert set(values) == {"input_ids", "input_lengths", "request_output_len", "stop", "request_key"}
    datatype, array = values["request_key"]
    assert datatype == "BYTES" and array.shape == (1, 1) and array[0, 0] == KEY.encode()


def test_request_key_is_a_bytes_input_and_an_echoed_output():
    values = input_values("hi", GenerationOptions(request_key=KEY))
    assert values["request_key"] == KEY and INPUT_DATATYPES["request_key"] == "BYTES"
    tensors = {name: (dt, arr) for name, dt, arr in grpc_tensors(values)}
    assert tensors["request_key"][0] == "BYTES" and tensors["request_key"][1].tolist() == [[KEY.encode()]]
    assert generate_body(values, "id-1")["request_key"] == KEY  # a plain string field in generate JSON
    echoed = np.array([[KEY.encode()]], dtype=np.object_)
    assert event_from_outputs({"text_output": "a", "request_key": echoed}, 0.0).request_key == KEY
    assert event_from_outputs({"text_output": "a", "request_key": KEY}, 0.0).request_key == KEY
    assert event_from_outputs({"text_output": "a", "request_key_out": KEY}, 0.0).request_key == KEY  # ensemble
    assert event_from_outputs({"text_output": "a"}, 0.0).request_key is None


@pytest.mark.parametrize(
    "outputs",
    [
        {"text_output": "日本", "finish_reason": "length", "output_ids": [5, 6], "num_output_tokens": 2},
        {"text_output": ["日", "本"], "finish_reason": ["length"], "output_ids": [[5, 6]], "num_output_tokens": [2]},
        {
            "text_output": np.array([["日本".encode()]], dtype=np.object_),
            "finish_reason": np.array([[b"length"]], dtype=np.object_),
            "output_ids": np.array([[5, 6]], dtype=np.int32),
            "num_output_tokens": np.array([[2]], dtype=np.int32),
        },
    ],
)
def test_event_parsing_accepts_json_scalars_lists_and_numpy(outputs):
    event = event_from_outputs(outputs, received_s=1.5)
    assert event.text == "日本" and event.finish_reason == "length"
    assert event.output_ids == (5, 6) and event.num_output_tokens == 2 and event.received_s == 1.5


def test_empty_finish_reason_means_none():
    assert event_from_outputs({"text_output": "a", "finish_reason": ""}, 0.0).finish_reason is None


def test_error_message_from_json_or_sse_bodies():
    assert error_message(b'{"error": "bad"}') == "bad"
    assert error_message(b'data: {"error": "worse"}\n\n') == "worse"
    assert error_message(b"plain text") == "plain text"


def test_continuation_ids_go_as_an_int32_list_over_both_transports():
    values = input_values("hi", GenerationOptions(max_tokens=8, continuation_ids=[5, 0, 49151]))
    tensors = {name: (dt, arr) for name, dt, arr in grpc_tensors(values)}
    datatype, array = tensors["continuation_ids"]
    assert datatype == "INT32" and array.dtype == np.int32 and array.tolist() == [[5, 0, 49151]]
    (grpc_input,) = [i for i in build_inputs(list(grpc_tensors(values))) if i.name() == "continuation_ids"]
    assert grpc_input.shape() == [1, 3] and grpc_input.datatype() == "INT32"
    assert generate_body(values, "id-1")["continuation_ids"] == [5, 0, 49151]  # a JSON list in generate


def test_an_empty_continuation_is_not_sent():
    assert "continuation_ids" not in input_values("hi", GenerationOptions(continuation_ids=[]))


@pytest.mark.parametrize("bad", [[1, -1], [True], [1.0], "12", [2**31]])
def test_continuation_ids_must_be_token_ids(bad):
    with pytest.raises(ValueError, match="^continuation_ids must be a list of token ids"):
        GenerationOptions(continuation_ids=bad)
