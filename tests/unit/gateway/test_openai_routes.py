"""The OpenAI routes end to end inside one process: the real app, the real
client library, a scripted engine (openai_fakes)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.config import LimitsConfig, TierConfig
from gateway.ops.metrics import exposition
from tests.unit.gateway.openai_fakes import AUTH, HANG, ev, harness, overloaded_script, simple_script

CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}


def sse_payloads(text: str) -> list[str]:
    """The `data` of each event (events also carry an `id:` line: resumable streams)."""
    return [
        line[len("data: ") :] for block in text.split("\n\n") for line in block.split("\n") if line.startswith("data: ")
    ]


def run(coro):
    return asyncio.run(coro)


async def post(h, path: str, body: dict, headers: dict | None = None):
    async with h.client() as client:
        return await client.post(path, json=body, headers={**AUTH, **(headers or {})})


def test_chat_whole_answer_has_text_usage_and_finish():
    h = harness(simple_script("Hello", " there", "!"))
    response = run(post(h, "/v1/chat/completions", CHAT))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there!", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert response.headers["x-ratelimit-limit-requests"] == "10"
    # upstream: messages as the public JSON string, output ids asked for, the tier's priority
    ((model, values, request_id),) = h.transport.opened
    assert model == "ensemble" and json.loads(values["messages"]) == [{"role": "user", "content": "Hi"}]
    assert values["text_input"] == "" and values["return_output_ids"] is True and values["priority"] == 7
    assert values["temperature"] == 0 and request_id == body["id"].removeprefix("chatcmpl-") + "-0"
    (admission,) = h.policy.admissions
    assert admission.released == 1 and sum(admission.tokens) == 3 + 5 - h.policy.admitted_prompt_tokens[0]


def test_chat_stream_chunks_usage_and_done():
    h = harness(simple_script("Hel", "lo"))
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    response = run(post(h, "/v1/chat/completions", body))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": "Hel"},
        {"content": "lo"},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, "stop"]
    assert all(c["usage"] is None and c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
    }


def test_held_back_tokens_are_counted_but_send_no_chunk():
    def script(model, values, request_id):
        return [ev("", ids=(1,)), ev("", ids=(2,)), ev("ab", ids=(3,), finish="length", final=True)]

    h = harness(script)
    response = run(post(h, "/v1/chat/completions", {**CHAT, "stream": True}))
    chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
    # the first (empty) response opens the choice with its role, the second sends nothing
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": ""}, {"content": "ab"}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in chunks[-1]


def test_completions_n2_fans_out_and_counts_the_prompt_once():
    h = harness(simple_script("a", "b"))
    response = run(post(h, "/v1/completions", {"model": "llm_bls", "prompt": "Say", "n": 2, "max_tokens": 4}))
    body = response.json()
    assert response.status_code == 200 and body["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "ab", "stop"),
        (1, "ab", "stop"),
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert [(m, v["text_input"], v["max_tokens"]) for m, v, _ in h.transport.opened] == [("llm_bls", "Say", 4)] * 2
    assert len({rid for _, _, rid in h.transport.opened}) == 2  # one Triton id per choice


def test_completions_batch_of_prompts_indexes_choices_per_prompt():
    h = harness(simple_script("x"))
    response = run(post(h, "/v1/completions", {"model": "ensemble", "prompt": ["p0", "p1"], "n": 2}))
    assert [c["index"] for c in response.json()["choices"]] == [0, 1, 2, 3]
    assert [v["text_input"] for _, v, _ in h.transport.opened] == ["p0", "p0", "p1", "p1"]
    assert response.json()["usage"]["prompt_tokens"] == 10  # two prompts, each once


def test_n_above_the_limit_is_refused_before_upstream():
    h = harness(simple_script("x"), limits=LimitsConfig(max_n=2))
    response = run(post(h, "/v1/chat/completions", {**CHAT, "n": 3}))
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"
    assert h.transport.opened == [] and h.policy.admissions == []


def test_tier_caps_max_tokens_and_sets_priority():
    h = harness(simple_script("x"), tier=TierConfig(priority=3, max_tokens_cap=10))
    run(post(h, "/v1/chat/completions", {**CHAT, "max_completion_tokens": 50, "priority": 99}))
    assert h.transport.opened == []  # `priority` is not a caller's parameter: refused
    run(post(h, "/v1/chat/completions", {**CHAT, "max_completion_tokens": 50}))
    run(post(h, "/v1/chat/completions", CHAT))
    assert [(v["max_tokens"], v["priority"]) for _, v, _ in h.transport.opened] == [(10, 3), (10, 3)]


def test_logprobs_of_the_chosen_tokens():
    def script(model, values, request_id):
        assert values["return_log_probs"] is True
        return [ev("A", ids=(11,), logprobs=(-0.5,)), ev("B", ids=(12,), logprobs=(-1.25,), finish="stop", final=True)]

    h = harness(script)
    body = run(post(h, "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 0})).json()
    assert body["choices"][0]["logprobs"]["content"] == [
        {"token": "token_id:11", "logprob": -0.5, "bytes": None, "top_logprobs": []},
        {"token": "token_id:12", "logprob": -1.25, "bytes": None, "top_logprobs": []},
    ]
    body = run(post(h, "/v1/completions", {"model": "ensemble", "prompt": "x", "logprobs": 0})).json()
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [-0.5, -1.25]


def test_streamed_logprobs_of_held_back_tokens_come_with_the_next_chunk():
    h = harness(
        lambda *a: [
            ev("A", ids=(1,), logprobs=(-0.1,)),
            ev("", ids=(2,), logprobs=(-0.2,)),
            ev("BC", ids=(3,), logprobs=(-0.3,), finish="stop", final=True),
        ]
    )
    response = run(post(h, "/v1/chat/completions", {**CHAT, "stream": True, "logprobs": True}))
    chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
    assert [[e["token"] for e in c["choices"][0]["logprobs"]["content"]] for c in chunks] == [
        ["token_id:1"],
        ["token_id:2", "token_id:3"],
    ]
    assert [e["logprob"] for e in chunks[1]["choices"][0]["logprobs"]["content"]] == [-0.2, -0.3]


def test_overload_is_503_with_retry_after():
    h = harness(overloaded_script)
    response = run(post(h, "/v1/chat/completions", CHAT))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "overloaded"
    assert len(h.transport.opened) == 1  # not retried inside the gateway
    assert h.policy.admissions[0].released == 1


def test_an_unreachable_triton_is_503_and_an_unexpected_refusal_502():
    from client.errors import RequestError, ServerConnectionError

    h = harness(lambda *a: [ServerConnectionError("connection refused")])
    response = run(post(h, "/v1/chat/completions", CHAT))
    assert response.status_code == 503 and response.json()["error"]["code"] == "upstream_unavailable"
    assert response.headers["retry-after"] == "1"
    h = harness(lambda *a: [RequestError("model 'ensemble' is not ready")])
    response = run(post(h, "/v1/chat/completions", CHAT))
    assert response.status_code == 502 and "ensemble" not in response.json()["error"]["message"]


def test_an_engine_field_error_is_400_naming_the_openai_param():
    from client.errors import RequestError

    h = harness(lambda *a: [RequestError("in ensemble 'ensemble', messages: too long (2000000 bytes)")])
    response = run(post(h, "/v1/chat/completions", CHAT))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"
    assert response.json()["error"]["message"].startswith("messages: too long")


@pytest.mark.parametrize("reason,status", [("timeout", 504), ("error", 502), ("cancelled", 502)])
def test_an_engine_failure_finish_is_an_error_not_a_finish(reason, status):
    h = harness(lambda *a: [ev("par", ids=(1,)), ev("tial", ids=(2,), finish=reason, final=True)])
    response = run(post(h, "/v1/chat/completions", CHAT))
    assert response.status_code == status and "error" in response.json()
    streamed = run(post(h, "/v1/chat/completions", {**CHAT, "stream": True}))
    payloads = sse_payloads(streamed.text)
    assert "[DONE]" not in payloads and "error" in json.loads(payloads[-1])


def test_a_stream_broken_off_mid_way_ends_with_an_error_event():
    from client.errors import ServerConnectionError

    h = harness(lambda *a: [ev("a", ids=(1,)), ServerConnectionError("reset")])
    payloads = sse_payloads(run(post(h, "/v1/chat/completions", {**CHAT, "stream": True})).text)
    assert json.loads(payloads[0])["choices"][0]["delta"]["content"] == "a"
    assert json.loads(payloads[-1])["error"]["code"] == "upstream_error" and "[DONE]" not in payloads


def test_request_ids_and_traceparent_are_echoed_never_sent_upstream():
    h = harness(simple_script("x"))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    response = run(post(h, "/v1/chat/completions", CHAT, headers={"x-request-id": "caller-1", "traceparent": parent}))
    assert response.headers["x-request-id"] == "caller-1"
    trace = response.headers["traceparent"].split("-")
    assert trace[1] == "0af7651916cd43dd8448eb211c80319c" and trace[2] != "b7ad6b7169203331"
    _, values, request_id = h.transport.opened[0]
    assert "caller-1" not in request_id and "request_id" not in values
    fresh = run(post(h, "/v1/chat/completions", CHAT)).headers
    assert len(fresh["x-request-id"]) == 24 and len(fresh["traceparent"].split("-")[1]) == 32


def hang_up_scenario(h, stream: bool, after_first_chunk: bool) -> list[dict]:
    """Drive the ASGI app directly: the caller hangs up after the first chunk
    (or at once, while the engine has not answered yet)."""

    async def scenario():
        body = json.dumps({**CHAT, "stream": stream}).encode()
        sent: list[dict] = []
        first_chunk = asyncio.Event()
        received = False

        async def receive():
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            if after_first_chunk:
                await first_chunk.wait()
            else:
                await asyncio.sleep(0.05)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                first_chunk.set()

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
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
        # stops sent while the loop still runs (asyncio.run's teardown would cancel any task left)
        await asyncio.sleep(0.05)
        h.stops_in_time = list(h.transport.stops)
        return sent

    return run(scenario())


def test_a_caller_hanging_up_mid_stream_stops_the_engine_request_at_once_without_a_grace_period():
    """With a tier grace period of 0 (no resume), the stream is cancelled as
    soon as the disconnect arrives: the client library sends `stop` with the
    request key, and the admission is released."""
    h = harness(lambda *a: [ev("first", ids=(1,)), HANG], tier=TierConfig(priority=7, stream_grace_s=0))
    sent = hang_up_scenario(h, stream=True, after_first_chunk=True)
    assert sent[0]["status"] == 200
    ((stop_model, _, key),) = h.stops_in_time
    assert stop_model == "python_llm" and len(key) == 32
    assert h.policy.admissions[0].released == 1


@pytest.mark.parametrize("stream", [True, False])
def test_a_caller_hanging_up_before_the_first_token_stops_the_queued_request(stream):
    """Even with a grace period: the caller never learnt the stream's id."""
    h = harness(lambda *a: [HANG])
    sent = hang_up_scenario(h, stream=stream, after_first_chunk=False)
    assert sent[0]["status"] == 499  # logged only: nobody is there to read it
    assert len(h.stops_in_time) == 1 and h.policy.admissions[0].released == 1


def test_a_caller_hanging_up_during_a_whole_answer_stops_it():
    h = harness(lambda *a: [ev("first", ids=(1,)), HANG])
    sent = hang_up_scenario(h, stream=False, after_first_chunk=False)
    assert not [m for m in sent if m["type"] == "http.response.body"]
    assert len(h.stops_in_time) == 1 and h.policy.admissions[0].released == 1


def test_models_list_follows_the_tier():
    h = harness(simple_script("x"), tier=TierConfig(allowed_models=("llm_bls",)))

    async def get(path):
        async with h.client() as client:
            return await client.get(path, headers=AUTH)

    assert [m["id"] for m in run(get("/v1/models")).json()["data"]] == ["llm_bls"]
    assert run(get("/v1/models/llm_bls")).json()["id"] == "llm_bls"
    assert run(get("/v1/models/ensemble")).status_code == 404
    assert run(post(h, "/v1/chat/completions", CHAT)).status_code == 403


def test_unknown_model_is_404_and_no_key_is_401():
    h = harness(simple_script("x"))
    response = run(post(h, "/v1/chat/completions", {**CHAT, "model": "gpt-4"}))
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"

    async def anonymous():
        async with h.client() as client:
            return await client.post("/v1/chat/completions", json={"junk": 1})

    response = run(anonymous())
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert h.transport.opened == []


def test_metrics_count_requests_and_key_usage():
    h = harness(simple_script("x", "y"))
    run(post(h, "/v1/chat/completions", CHAT))

    text = exposition()[0].decode()  # what the ops listener serves (test_ops.py)
    assert 'gateway_requests_total{route="chat",status="200",tier="free"}' in text
    assert 'gateway_key_completion_tokens_total{key_id="k1",tier="free"}' in text
    assert "gateway_time_to_first_token_seconds_bucket" in text and "gateway_added_latency_seconds" in text
