"""The wire formats of Triton's protocols (gateway/triton/raw.py, wire_json.py,
wire_proto.py, outputs.py), checked against tritonclient's own encoders and
decoders: what tritonclient sends decodes to the right inputs, and what the
gateway renders decodes in tritonclient to the engine's arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from gateway.config import TierConfig
from gateway.core.errors import GatewayError
from gateway.core.policy import Caller
from gateway.triton.inputs import validate
from gateway.triton.outputs import check_requested, generate_json, infer_json, infer_proto, output_names, visible
from gateway.triton.raw import decode_raw, encode_raw
from gateway.triton.wire_json import generate_inputs, infer_body, split_body
from gateway.triton.wire_proto import proto_request, validated_request
from tests.unit.gateway.triton_fakes import KEY, outputs

CALLER = Caller("k1", "free", TierConfig(priority=3))


def test_raw_round_trips_and_refuses_malformed_content():
    assert decode_raw("BYTES", encode_raw(np.array([[b"ab", b"", "é".encode()]], dtype=np.object_))) == [
        b"ab",
        b"",
        "é".encode(),
    ]
    assert decode_raw("INT32", encode_raw(np.array([[1, -2]], dtype=np.int32))) == [1, -2]
    assert decode_raw("UINT64", encode_raw(np.array([2**64 - 1], dtype=np.uint64))) == [2**64 - 1]
    assert decode_raw("BOOL", b"\x01\x00") == [True, False]
    assert encode_raw(np.zeros((1, 0), dtype=np.object_)) == b""
    for datatype, data, message in (
        ("BYTES", b"\x05\x00\x00\x00ab", "an element runs past the end"),
        ("BYTES", b"\x01\x00", "a truncated length prefix"),
        ("INT32", b"\x01\x00\x00", "not a whole number of INT32 values"),
        ("BOOL", b"\x02", "must be bytes 0 or 1"),
    ):
        with pytest.raises(ValueError, match=message):
            decode_raw(datatype, data)


def grpc_request(
    *inputs: grpcclient.InferInput, model: str = "ensemble", request_id: str = "", outputs: list[str] | None = None
) -> service_pb2.ModelInferRequest:
    """The protobuf tritonclient.grpc sends (raw_input_contents), built by its own code."""
    from tritonclient.grpc._utils import _get_inference_request

    requested = [grpcclient.InferRequestedOutput(name) for name in outputs or ()]
    return _get_inference_request(
        model_name=model,
        inputs=list(inputs),
        model_version="",
        request_id=request_id,
        outputs=requested or None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )


def grpc_input(name: str, datatype: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_what_tritonclient_grpc_sends_decodes_and_validates():
    request = grpc_request(
        grpc_input("text_input", "BYTES", np.array([["Hé".encode()]], dtype=np.object_)),
        grpc_input("max_tokens", "INT32", np.array([[8]], dtype=np.int32)),
        grpc_input("temperature", "FP32", np.array([[0.25]], dtype=np.float32)),
        grpc_input("stop_words", "BYTES", np.array([[b"a", b"bc"]], dtype=np.object_)),
        grpc_input("stream", "BOOL", np.array([[True]])),
        request_id="caller-7",
        outputs=["text_output"],
    )
    assert len(request.raw_input_contents) == 5
    call, requested = validated_request(CALLER, request, stream_refusal=None)
    assert (call.text_input, call.options.max_tokens, call.options.temperature) == ("Hé", 8, 0.25)
    assert call.options.stop_words == ["a", "bc"] and call.streaming and call.caller_id == "caller-7"
    assert call.options.priority == 3 and requested == ["text_output"] and call.options.request_id != "caller-7"


def test_protobuf_contents_and_their_refusals():
    request = service_pb2.ModelInferRequest(model_name="llm_bls")
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    text.contents.bytes_contents.append(b"hello")
    seed = request.inputs.add(name="seed", datatype="UINT64", shape=[1])
    seed.contents.uint64_contents.append(2**64 - 1)
    call = validate("llm_bls", proto_request(request).inputs, tier=TierConfig(), request_id="r")
    assert call.text_input == "hello" and call.options.seed == 2**64 - 1

    seed.contents.Clear()
    seed.contents.int64_contents.append(5)
    with pytest.raises(
        GatewayError, match="seed: values given in int64_contents, which is not the field of datatype UINT64"
    ):
        validate("llm_bls", proto_request(request).inputs, tier=TierConfig(), request_id="r")

    raw = service_pb2.ModelInferRequest(model_name="ensemble")
    raw.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    raw.inputs.add(name="max_tokens", datatype="INT32", shape=[1, 1])
    raw.raw_input_contents.append(encode_raw(np.array([[b"x"]], dtype=np.object_)))
    with pytest.raises(GatewayError, match="raw_input_contents: 1 given for 2 inputs") as caught:
        proto_request(raw)
    assert caught.value.param == "raw_input_contents"
    raw.raw_input_contents.append(b"\x01\x00")  # two bytes for an INT32
    with pytest.raises(GatewayError, match="max_tokens: raw content of 2 bytes is not a whole number"):
        validate("ensemble", proto_request(raw).inputs, tier=TierConfig(), request_id="r")
    raw.inputs[1].contents.int_contents.append(3)
    with pytest.raises(GatewayError, match="max_tokens: has both contents and raw_input_contents"):
        proto_request(raw)


def test_what_tritonclient_http_sends_decodes_json_and_binary():
    for binary in (False, True):
        text = httpclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([["Hi"]], dtype=np.object_), binary_data=binary)
        words = httpclient.InferInput("stop_words", [1, 2], "BYTES")
        words.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_), binary_data=binary)
        tokens = httpclient.InferInput("max_tokens", [1, 1], "INT32")
        tokens.set_data_from_numpy(np.array([[4]], dtype=np.int32), binary_data=binary)
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [text, words, tokens],
            request_id="abc",
            outputs=[httpclient.InferRequestedOutput("text_output", binary_data=binary)],
        )
        head, data = split_body(body, None if json_size is None else str(json_size))
        decoded = infer_body(json.loads(head), data)
        call = validate("ensemble", decoded.inputs, tier=TierConfig(), request_id="r", caller_id=decoded.caller_id)
        assert (call.text_input, call.options.stop_words, call.options.max_tokens) == ("Hi", ["a", "b"], 4)
        assert decoded.caller_id == "abc" and decoded.requested == ["text_output"]
        assert decoded.binary_outputs == ({"text_output"} if binary else set())


@pytest.mark.parametrize(
    "body, binary, message",
    [
        ([], b"", "The body must be a JSON object"),
        ({"inputs": []}, b"", "inputs: must be a non-empty list"),
        ({"inputs": [{"name": "text_input"}], "extra": 1}, b"", "extra: unknown field of the infer request"),
        ({"inputs": [{"datatype": "BYTES"}]}, b"", "inputs[0]: needs a string name"),
        ({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}]}, b"", "text_input: needs data"),
        (
            {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": "1", "data": ["x"]}]},
            b"",
            "text_input: shape must be a list of integers",
        ),
        (
            {
                "inputs": [
                    {"name": "text_input", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}
                ]
            },
            b"abc",
            "text_input: binary_data_size 9 runs past",
        ),
        (
            {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
            b"abc",
            "binary_data_size: the inputs' sizes add up to 0 bytes, the binary part holds 3",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "text_input",
                        "datatype": "BYTES",
                        "shape": [1],
                        "data": ["x"],
                        "parameters": {"shared_memory_region": "r"},
                    }
                ]
            },
            b"",
            "text_input: shared memory is not served",
        ),
    ],
)
def test_kserve_json_refusals(body, binary, message):
    with pytest.raises(GatewayError) as caught:
        infer_body(body, binary)
    assert caught.value.status == 400 and caught.value.message.startswith(message), caught.value.message


def test_nested_json_data_is_flattened_row_major():
    decoded = infer_body(
        {
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [["x"]]},
                {"name": "bad_words", "datatype": "BYTES", "shape": [1, 2], "data": [["p", "q"]]},
            ]
        },
        b"",
    )
    call = validate("ensemble", decoded.inputs, tier=TierConfig(), request_id="r")
    assert call.options.bad_words == ["p", "q"]


def test_generate_json_renders_like_triton():
    call = validate("ensemble", generate_inputs({"text_input": "x"})[0], tier=TierConfig(), request_id="r")
    shown = visible(call, outputs("ensemble", "-and-go", ids=(1, 2, 3, 4), finish="length", prompt=1))
    body = generate_json("ensemble", shown, "abc")
    assert body == {
        "model_name": "ensemble",
        "model_version": "1",
        "id": "abc",
        "text_output": "-and-go",
        "finish_reason": "length",
        "request_key_out": KEY,
        "num_input_tokens": 1,
        "num_output_tokens": 4,
        "output_ids": [],
        "cum_log_probs": [],
        "output_log_probs": [],
        "arrival_time_ns": 0,
        "first_token_time_ns": 0,
        "last_token_time_ns": 0,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
    }
    assert "id" not in generate_json("ensemble", shown, None)
    wants_ids = validate(
        "llm_bls", generate_inputs({"text_input": "x", "return_output_ids": True})[0], tier=TierConfig(), request_id="r"
    )
    one = generate_json("llm_bls", visible(wants_ids, outputs("llm_bls", "a", ids=(7,))), None)
    assert one["output_ids"] == 7 and one["request_key"] == KEY  # one element: a scalar, as Triton does
    assert generate_json("llm_bls", visible(wants_ids, outputs("llm_bls", "ab", ids=(7, 8))), None)["output_ids"] == [
        7,
        8,
    ]


def test_requested_outputs_are_checked_per_model():
    check_requested("ensemble", ["text_output", "request_key_out"])
    check_requested("llm_bls", ["request_key"])
    with pytest.raises(GatewayError, match="request_key: unknown output of ensemble"):
        check_requested("ensemble", ["request_key"])
    assert "request_key_out" in output_names("ensemble") and "request_key" in output_names("llm_bls")


def test_infer_proto_decodes_in_tritonclient_with_the_final_flag():
    call = validate(
        "ensemble",
        generate_inputs({"text_input": "x", "return_output_ids": True})[0],
        tier=TierConfig(),
        request_id="r",
    )
    arrays = visible(call, outputs("ensemble", "Paris", ids=(5, 6), finish="stop"))
    response = infer_proto("ensemble", arrays, "id-1", final=True)
    result = grpcclient.InferResult(response)
    assert result.as_numpy("text_output").tolist() == [[b"Paris"]]
    assert result.as_numpy("output_ids").tolist() == [[5, 6]] and result.as_numpy("output_ids").dtype == np.int32
    assert result.as_numpy("output_log_probs").shape == (1, 0, 0)
    assert response.parameters["triton_final_response"].bool_param is True and response.id == "id-1"
    assert response.parameters["sequence_id"].int64_param == 0 and not response.parameters["sequence_end"].bool_param
    assert "triton_final_response" not in infer_proto("ensemble", arrays, None).parameters
    only = visible(call, outputs("ensemble", "P"), ["finish_reason", "text_output"])
    assert list(only) == ["finish_reason", "text_output"]


def test_infer_json_binary_and_plain_decode_in_tritonclient():
    call = validate("ensemble", generate_inputs({"text_input": "x"})[0], tier=TierConfig(), request_id="r")
    arrays = visible(call, outputs("ensemble", "Paris", ids=(5, 6), finish="stop"))
    for binary in (set(), {"text_output", "num_input_tokens", "output_ids"}):
        header, data = infer_json("ensemble", arrays, "q", binary)
        head = json.dumps(header).encode()
        result = httpclient.InferenceServerClient.parse_response_body(
            head + data, header_length=len(head) if binary else None
        )
        assert result.as_numpy("text_output").reshape(-1).tolist() in ([b"Paris"], ["Paris"])
        assert result.as_numpy("num_input_tokens").reshape(-1).tolist() == [5]
        assert result.as_numpy("output_ids").size == 0  # not asked for
        assert result.get_response()["id"] == "q" and result.get_response()["model_version"] == "1"
        assert result.get_response()["parameters"] == {"sequence_end": False, "sequence_id": 0, "sequence_start": False}
