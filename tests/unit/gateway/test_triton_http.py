"""Triton's HTTP protocol through the gateway, inside one process: the real
app, the real client library, a scripted engine answering with the raw
outputs Triton sends (triton_fakes). generate / generate_stream / infer
answer as Triton would, every refusal is Triton's `{"error": "..."}` with the
right status, before anything reaches the engine."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from client.errors import ServerConnectionError
from gateway.config import LimitsConfig, TierConfig
from gateway.ops.metrics import exposition
from tests.unit.gateway.openai_fakes import AUTH, HANG, harness, overloaded_script
from tests.unit.gateway.triton_fakes import engine, tev

BODY = {"text_input": "Say", "max_tokens": 4, "temperature": 0.0}


def run(coro):
    return asyncio.run(coro)


async def call(h, method: str, path: str, **kwargs):
    headers = {**AUTH, **kwargs.pop("headers", {})}
    async with h.client() as client:
        return await client.request(method, path, headers=headers, **kwargs)


def sse_data(text: str) -> list[dict]:
    return [
        json.loads(line[len("data: ") :])
        for block in text.split("\n\n")
        for line in block.split("\n")
        if line.startswith("data: ")
    ]


def test_generate_answers_whole_like_triton_with_the_gateways_ids_and_the_tiers_values():
    h = harness(engine("-and", "-go"), tier=TierConfig(priority=9, max_tokens_cap=3))
    response = run(call(h, "POST", "/v2/models/ensemble/generate", json={**BODY, "id": "abc", "priority": 1}))
    assert response.status_code == 200, response.text
    assert response.json() == {
        "model_name": "ensemble",
        "model_version": "1",
        "id": "abc",
        "text_output": "-and-go",
        "finish_reason": "length",
        "request_key_out": h.transport.opened[0][1]["request_key"],
        "num_input_tokens": 5,
        "num_output_tokens": 2,
        "output_ids": [],
        "cum_log_probs": [],
        "output_log_probs": [],
        "arrival_time_ns": 0,
        "first_token_time_ns": 0,
        "last_token_time_ns": 0,
        # the ensemble scheduler's response parameters, as Triton renders them
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
    }
    ((model, values, request_id),) = h.transport.opened
    assert model == "ensemble" and values["stream"] is False and values["priority"] == 9
    assert values["max_tokens"] == 3 and values["return_output_ids"] is True
    assert request_id != "abc" and request_id == response.headers["x-request-id"]
    (admission,) = h.policy.admissions
    assert admission.released == 1 and sum(admission.tokens) == 2 + 5 - h.policy.admitted_prompt_tokens[0]
    assert response.headers["x-ratelimit-limit-requests"] == "10"


def test_generate_refuses_stream_true_and_bad_inputs_before_the_engine():
    h = harness(engine("x"))
    cases = [
        ({**BODY, "stream": True}, "stream: must be false on generate"),
        ({**BODY, "max_tokens": "4"}, "max_tokens: expected an integer (INT32), got a string"),
        ({**BODY, "nope": 1}, "nope: unknown input"),
        ({"max_tokens": 4}, "text_input: required"),
    ]
    for body, message in cases:
        response = run(call(h, "POST", "/v2/models/ensemble/generate", json=body))
        assert response.status_code == 400 and response.json()["error"].startswith(message), response.text
        assert list(response.json()) == ["error"]
    for raw, message in ((b"[1]", "The body must be a JSON object"), (b"{", "The body is not valid JSON")):
        response = run(
            call(h, "POST", "/v2/models/ensemble/generate", content=raw, headers={"content-type": "application/json"})
        )
        assert response.status_code == 400 and response.json()["error"].startswith(message)
    assert h.transport.opened == [] and h.policy.admissions == []


def test_refusals_are_tritons_shape_with_their_status_and_headers():
    h = harness(engine("x"), tier=TierConfig(allowed_models=("llm_bls",)), limits=LimitsConfig(max_body_bytes=1000))

    async def anonymous():
        async with h.client() as client:
            return await client.post("/v2/models/llm_bls/generate", json=BODY)

    assert run(anonymous()).status_code == 401 and "API key" in run(anonymous()).json()["error"]
    forbidden = run(call(h, "POST", "/v2/models/ensemble/generate", json=BODY))
    assert forbidden.status_code == 403 and list(forbidden.json()) == ["error"]
    unknown = run(call(h, "POST", "/v2/models/python_llm/generate", json=BODY))
    assert unknown.status_code == 404 and unknown.json() == {
        "error": "Request for unknown model: 'python_llm' is not found"
    }
    assert run(call(h, "POST", "/v2/models/llm_bls/versions/2/generate", json=BODY)).status_code == 404
    big = run(call(h, "POST", "/v2/models/llm_bls/generate", json={"text_input": "x" * 2000}))
    assert big.status_code == 413 and big.json() == {"error": "The request body exceeds 1000 bytes."}
    form = run(call(h, "POST", "/v2/models/llm_bls/generate", data={"a": "b"}))
    assert form.status_code == 415 and list(form.json()) == ["error"]
    for path in ("/v2/repository/index", "/v2/logging", "/v2/models/stats", "/v2/systemsharedmemory/status"):
        for method in ("GET", "POST"):
            answer = run(call(h, method, path, json={}))
            assert answer.status_code in (404, 405) and list(answer.json()) == ["error"], (path, answer.text)
    assert h.transport.opened == []
    # the OpenAI routes keep OpenAI's shape
    assert "message" in run(call(h, "POST", "/v1/completions", json={"model": "x"})).json()["error"]


def test_an_overloaded_engine_is_a_503_with_retry_after_and_the_admission_is_released():
    h = harness(overloaded_script)
    response = run(call(h, "POST", "/v2/models/ensemble/generate", json=BODY))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert list(response.json()) == ["error"] and h.policy.admissions[0].released == 1


def test_a_text_stage_refusal_is_a_400_naming_the_input():
    from client.errors import RequestError

    h = harness(lambda *a: [RequestError("in ensemble 'ensemble', max_tokens: must be <= 2048, got 5000")])
    response = run(call(h, "POST", "/v2/models/ensemble/generate", json=BODY))
    assert response.status_code == 400 and response.json() == {"error": "max_tokens: must be <= 2048, got 5000"}


def test_generate_stream_sends_each_response_as_an_sse_event():
    h = harness(engine("Hel", "lo"))
    response = run(
        call(
            h,
            "POST",
            "/v2/models/llm_bls/generate_stream",
            json={**BODY, "stream": True, "id": "s1", "return_output_ids": True},
        )
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_data(response.text)
    assert [e["text_output"] for e in events] == ["Hel", "lo"] and [e["output_ids"] for e in events] == [100, 101]
    assert [e["finish_reason"] for e in events] == ["", "length"]
    key = h.transport.opened[0][1]["request_key"]
    assert all(e["id"] == "s1" and e["model_name"] == "llm_bls" and e["request_key"] == key for e in events)
    assert "id: 1\n" in response.text and h.transport.opened[0][1]["stream"] is True
    # stream false on generate_stream: one event with the whole answer, as Triton does
    whole = sse_data(run(call(h, "POST", "/v2/models/llm_bls/generate_stream", json=BODY)).text)
    assert [e["text_output"] for e in whole] == ["Hello"]
    assert all(a.released == 1 for a in h.policy.admissions)


def test_generate_stream_refusals_are_statuses_and_a_break_is_an_error_event():
    h = harness(overloaded_script)
    refused = run(call(h, "POST", "/v2/models/ensemble/generate_stream", json={**BODY, "stream": True}))
    assert refused.status_code == 503 and list(refused.json()) == ["error"]
    broken = harness(lambda model, *a: [tev(model, "a", (1,)), ServerConnectionError("reset")])
    events = sse_data(
        run(call(broken, "POST", "/v2/models/ensemble/generate_stream", json={**BODY, "stream": True})).text
    )
    assert events[0]["text_output"] == "a" and list(events[-1]) == ["error"]
    assert "failed mid-stream" in events[-1]["error"]


def infer_request(binary: bool, *, stream: bool = False, outputs: list[str] | None = None) -> tuple[bytes, dict]:
    """The body and headers tritonclient.http sends for infer (its own encoder)."""
    text = httpclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([["Say"]], dtype=np.object_), binary_data=binary)
    flag = httpclient.InferInput("stream", [1, 1], "BOOL")
    flag.set_data_from_numpy(np.array([[stream]]), binary_data=binary)
    requested = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in outputs or ()]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [text, flag], outputs=requested or None, request_id="r-1"
    )
    headers = {"content-type": "application/json"}
    if json_size is not None:
        headers["inference-header-content-length"] = str(json_size)
    return body, headers


@pytest.mark.parametrize("binary", [False, True])
def test_infer_answers_what_tritonclient_http_decodes(binary):
    h = harness(engine("Par", "is", finish="stop"))
    body, headers = infer_request(binary)
    response = run(call(h, "POST", "/v2/models/ensemble/infer", content=body, headers=headers))
    assert response.status_code == 200, response.text
    # no outputs named: tritonclient asks for binary_data_output, as Triton answers it
    length = response.headers.get("inference-header-content-length")
    assert length is not None and response.headers["content-type"] == "application/octet-stream"
    result = httpclient.InferenceServerClient.parse_response_body(
        response.content, header_length=int(length) if length else None
    )
    assert result.as_numpy("text_output").reshape(-1).tolist() in ([b"Paris"], ["Paris"])
    assert result.as_numpy("finish_reason").reshape(-1).tolist() in ([b"stop"], ["stop"])
    assert result.get_response()["id"] == "r-1" and h.transport.opened[0][1]["stream"] is False
    named, named_headers = infer_request(binary, outputs=["text_output"])
    answer = run(call(h, "POST", "/v2/models/ensemble/infer", content=named, headers=named_headers))
    assert [
        o["name"]
        for o in json.loads(
            answer.content[: int(answer.headers.get("inference-header-content-length", len(answer.content)))]
        )["outputs"]
    ] == ["text_output"]


def test_infer_refuses_stream_unknown_outputs_and_bad_binary():
    h = harness(engine("x"))
    body, headers = infer_request(False, stream=True)
    refused = run(call(h, "POST", "/v2/models/ensemble/infer", content=body, headers=headers))
    assert refused.status_code == 400 and refused.json()["error"].startswith("stream: must be false on infer")
    body, headers = infer_request(False, outputs=["nope"])
    unknown = run(call(h, "POST", "/v2/models/ensemble/infer", content=body, headers=headers))
    assert unknown.status_code == 400 and unknown.json()["error"].startswith("nope: unknown output of ensemble")
    body, headers = infer_request(True)
    cut = run(call(h, "POST", "/v2/models/ensemble/infer", content=body[:-2], headers=headers))
    assert cut.status_code == 400 and "binary_data_size" in cut.json()["error"]
    wrong = run(
        call(
            h,
            "POST",
            "/v2/models/ensemble/infer",
            content=body,
            headers={**headers, "inference-header-content-length": "x"},
        )
    )
    assert wrong.status_code == 400 and "Inference-Header-Content-Length" in wrong.json()["error"]
    assert h.transport.opened == []


def test_health_metadata_and_config():
    h = harness(engine("x"), tier=TierConfig(allowed_models=("ensemble",)))

    async def anonymous(path):
        async with h.client() as client:
            return await client.get(path)

    assert run(anonymous("/v2/health/live")).status_code == 200
    assert run(anonymous("/v2/health/ready")).status_code == 200
    assert run(anonymous("/v2")).status_code == 401 and run(anonymous("/v2/models/ensemble")).status_code == 401
    server = run(call(h, "GET", "/v2")).json()
    assert server["name"] == "triton" and "generate" in server["extensions"]
    meta = run(call(h, "GET", "/v2/models/ensemble")).json()
    assert meta["versions"] == ["1"] and meta["platform"] == "ensemble"
    assert {"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]} in meta["inputs"]
    assert {"name": "stop_words", "datatype": "BYTES", "shape": [-1, -1]} in meta["inputs"]
    assert "request_key_out" in [o["name"] for o in meta["outputs"]]
    assert run(call(h, "GET", "/v2/models/ensemble/versions/1")).json() == meta
    assert run(call(h, "GET", "/v2/models/ensemble/ready")).status_code == 200
    config = run(call(h, "GET", "/v2/models/ensemble/config")).json()
    assert config["model_transaction_policy"] == {"decoupled": True} and config["max_batch_size"] == 1
    assert run(call(h, "GET", "/v2/models/llm_bls/ready")).status_code == 403
    assert run(call(h, "GET", "/v2/models/preprocessing")).status_code == 404
    assert run(call(h, "GET", "/v2/models/preprocessing/config")).status_code == 404


def test_a_caller_hanging_up_during_a_whole_answer_stops_the_engine_request():
    h = harness(lambda *a: [HANG])

    async def scenario():
        body = json.dumps(BODY).encode()
        sent: list[dict] = []
        received = False

        async def receive():
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v2/models/ensemble/generate",
            "raw_path": b"/v2/models/ensemble/generate",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"authorization", AUTH["Authorization"].encode())],
            "http_version": "1.1",
            "scheme": "http",
            "server": ("gw", 80),
            "client": ("1.2.3.4", 5),
            "root_path": "",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
        }
        await asyncio.wait_for(h.app(scope, receive, send), 5)
        await asyncio.sleep(0.05)
        return sent, list(h.transport.stops)

    sent, stops = run(scenario())
    assert not [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    ((stop_model, _, key),) = stops
    assert stop_model == "python_llm" and len(key) == 32 and h.policy.admissions[0].released == 1


def test_metrics_label_the_triton_routes():
    h = harness(engine("x"))
    run(call(h, "POST", "/v2/models/ensemble/generate", json=BODY))
    run(call(h, "POST", "/v2/models/ensemble/generate_stream", json=BODY))
    run(call(h, "GET", "/v2/models/nope/whatever"))
    text = exposition()[0].decode()  # what the ops listener serves (test_ops.py)
    assert 'gateway_requests_total{route="generate",status="200",tier="free"}' in text
    assert 'gateway_requests_total{route="generate_stream",status="200",tier="free"}' in text
    assert 'route="triton_metadata",status="404"' in text
