"""The gateway's OpenAI API against the real stack: a real tritonserver, the
gateway as its own process (`python -m gateway serve`), the real `openai` SDK.
Greedy answers equal `ensemble` called directly, with exact usage; a caller
hanging up mid-stream frees its KV blocks; the guards answer 413 / 415 / 400
before anything reaches Triton; an overloaded engine is a 503 with Retry-After."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from gateway.admission.keys import KeyStore
from serving.gateway_process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.triton_calls import scrape_metrics, sse_stream, wait_for

pytestmark = pytest.mark.e2e

QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": QUESTION}]
MAX_TOKENS = 24


@dataclass
class Gateway:
    process: GatewayProcess
    base_url: str  # ends in /v1
    key: str

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def sdk(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key=self.key, max_retries=0, **kwargs)


def start_gateway(triton: TritonServer, work: Path, *extra: str) -> Gateway:
    (port,) = free_local_ports(1)
    keys = work / "keys.json"
    key = KeyStore(keys).create("paid", label="e2e").key
    # no gRPC door unless a test asks for one (`extra`, applied last, wins): fleets must not share :9001
    process = GatewayProcess(
        [
            f"gateway.port={port}",
            "gateway.host=127.0.0.1",
            "gateway.public_grpc_port=0",
            f"gateway.fleet.upstream_grpc_url={triton.grpc_url}",
            f"gateway.keys_file={keys}",
            *extra,
        ],
        log_path=work / "gateway.log",
        port=port,
    )
    started = time.monotonic()
    process.start()
    print(f"\n[gateway ready in {time.monotonic() - started:.1f} s on :{port}; log {process.log_path}]")
    return Gateway(process, f"http://127.0.0.1:{port}/v1", key)


@pytest.fixture(scope="module")
def gateway(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    started = start_gateway(triton_server, tmp_path_factory.mktemp("gateway"))
    yield started
    assert started.process.stop() == 0


def direct(triton: TritonServer, model: str = "ensemble", **inputs: object) -> tuple[str, int, int]:
    """(text, output tokens, prompt tokens) of one greedy request straight to Triton."""
    body = {
        "text_input": "",
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "stream": True,
        "return_output_ids": True,
        "return_num_input_tokens": True,
        **inputs,
    }
    result = sse_stream(triton.http_url, model, body)
    assert result.error is None, result.error
    ids = [
        i
        for e in result.events
        for i in (
            e.get("output_ids")
            if isinstance(e.get("output_ids"), list)
            else [e["output_ids"]]
            if "output_ids" in e
            else []
        )
    ]
    prompt = next(int(e["num_input_tokens"]) for e in result.events if "num_input_tokens" in e)
    return result.text, len(ids), prompt


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_chat_whole_and_streamed_equal_ensemble_direct_with_exact_usage(gateway, triton_server, model):
    text, completion, prompt = direct(triton_server, messages=json.dumps(MESSAGES))
    sdk = gateway.sdk()
    whole = sdk.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].message.content == text and "Paris" in text
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt, completion)

    started = time.perf_counter()
    deltas, usage, first_s = [], None, None
    for chunk in sdk.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                first_s = first_s or time.perf_counter() - started
                deltas.append(choice.delta.content)
    assert "".join(deltas) == text
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        prompt,
        completion,
        prompt + completion,
    )
    print(f"[{model}] {text!r}: {prompt} + {completion} tokens; streamed TTFT {first_s * 1000:.0f} ms")


def test_completions_whole_and_streamed_equal_ensemble_direct(gateway, triton_server):
    prompt_text = "The capital of France is"
    text, completion, prompt = direct(triton_server, text_input=prompt_text)
    sdk = gateway.sdk()
    whole = sdk.completions.create(model="ensemble", prompt=prompt_text, max_tokens=MAX_TOKENS, temperature=0)
    assert whole.choices[0].text == text
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt, completion)
    streamed = "".join(
        c.choices[0].text
        for c in sdk.completions.create(
            model="ensemble", prompt=prompt_text, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == text


def test_n2_returns_two_indexed_choices_and_counts_both(gateway, triton_server):
    text, completion, prompt = direct(triton_server, messages=json.dumps(MESSAGES))
    answer = gateway.sdk().chat.completions.create(
        model="ensemble", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, n=2
    )
    assert sorted(c.index for c in answer.choices) == [0, 1]
    assert [c.message.content for c in answer.choices] == [text, text]
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt, 2 * completion)
    streamed: dict[int, str] = {}
    for chunk in gateway.sdk().chat.completions.create(
        model="ensemble", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, n=2, stream=True
    ):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert streamed == {0: text, 1: text}


def kv_blocks_used(triton: TritonServer) -> float:
    return scrape_metrics(triton.metrics_url)["llm_kv_cache_blocks_used"]


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_a_caller_hanging_up_mid_stream_frees_the_kv_blocks(gateway, triton_server, model):
    idle = kv_blocks_used(triton_server)

    async def hang_up() -> float:
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0)
        stream = await client.completions.create(
            model=model,
            prompt="Write a very long story about the sea.",
            max_tokens=400,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks = 0
        async for _ in stream:
            chunks += 1
            if chunks >= 5:
                break
        busy = kv_blocks_used(triton_server)
        await stream.close()  # closes the connection: the gateway sees the disconnect
        await client.close()
        return busy

    busy = asyncio.run(hang_up())
    assert busy > idle, "the running request held no KV blocks: nothing to measure"
    started = time.monotonic()
    while kv_blocks_used(triton_server) > idle:
        assert time.monotonic() - started < 30, f"{model}: KV blocks not freed within 30 s of the hang-up"
        time.sleep(0.05)
    print(f"\n[{model}] KV blocks back to idle {time.monotonic() - started:.2f} s after the caller hung up")


def test_guards_answer_before_triton(gateway, triton_server):
    before = scrape_metrics(triton_server.metrics_url).get("nv_inference_request_success", 0.0)
    headers = {"Authorization": f"Bearer {gateway.key}"}
    with httpx.Client(base_url=gateway.root, timeout=30) as http:
        big = http.post(
            "/v1/chat/completions",
            headers={**headers, "content-type": "application/json"},
            content=b'{"model": "ensemble", "messages": [' + b" " * 2_000_000 + b"]}",
        )
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

        def chunked():
            yield b'{"model": "ensemble", "prompt": "'
            for _ in range(300):
                yield b"x" * 10_000

        streamed_big = http.post(
            "/v1/completions", headers={**headers, "content-type": "application/json"}, content=chunked()
        )
        assert streamed_big.status_code == 413
        form = http.post("/v1/chat/completions", headers=headers, data={"model": "ensemble"})
        assert form.status_code == 415
        deep = http.post(
            "/v1/chat/completions",
            headers={**headers, "content-type": "application/json"},
            content=b'{"model": "ensemble", "messages": ' + b"[" * 40 + b"]" * 40 + b"}",
        )
        assert deep.status_code == 400 and deep.json()["error"]["code"] == "json_too_deep"
        nokey = http.post("/v1/chat/completions", json={"model": "ensemble", "messages": MESSAGES})
        assert nokey.status_code == 401
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.sdk().chat.completions.create(
            model="ensemble", messages=MESSAGES, tools=[{"type": "function", "function": {"name": "f"}}]
        )
    assert refused.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.sdk().chat.completions.create(model="ensemble", messages=MESSAGES, logprobs=True, top_logprobs=3)
    assert refused.value.body["param"] == "top_logprobs"
    after = scrape_metrics(triton_server.metrics_url).get("nv_inference_request_success", 0.0)
    assert after == before, "a refused request reached Triton"


def test_ids_trace_and_metrics(gateway):
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    raw = gateway.sdk().chat.completions.with_raw_response.create(
        model="ensemble",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        extra_headers={"x-request-id": "mine-123", "traceparent": parent},
    )
    assert raw.headers["x-request-id"] == "mine-123"
    assert raw.headers["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    # the access line is written once the response is done: poll for it (generous bound)
    took = wait_for(lambda: "mine-123" in gateway.process.log_path.read_text(), 30.0)
    print(f"\n[access log line written {took * 1000:.0f} ms after the response]")
    log = gateway.process.log_path.read_text()
    assert QUESTION not in log and gateway.key not in log
    metrics = httpx.get(gateway.process.metrics_url).text
    assert 'gateway_requests_total{route="chat",status="200",tier="paid"}' in metrics
    assert "gateway_key_completion_tokens_total" in metrics


def test_an_overloaded_engine_is_a_503_with_retry_after(start_triton, tmp_path_factory):
    # one running sequence, one waiting, each step slowed: a third request finds the queue full
    triton = start_triton(max_num_seqs=1, max_queue_size=1, debug_step_delay_ms=100)
    gateway = start_gateway(triton, tmp_path_factory.mktemp("gateway-overload"))
    try:

        async def crowd() -> list[object]:
            client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=gateway.key, max_retries=0)

            async def one() -> object:
                try:
                    return await client.completions.create(
                        model="ensemble", prompt="Count to one hundred:", max_tokens=30, extra_body={"ignore_eos": True}
                    )
                except openai.APIStatusError as exc:
                    return exc

            try:
                return await asyncio.gather(*(one() for _ in range(4)))
            finally:
                await client.close()

        outcomes = asyncio.run(crowd())
        refused = [o for o in outcomes if isinstance(o, openai.APIStatusError)]
        assert refused, outcomes
        assert all(r.status_code == 503 and r.response.headers["retry-after"] == "1" for r in refused), refused
        assert refused[0].body["code"] == "overloaded"
        print(f"\n[overload] {len(refused)} of {len(outcomes)} refused with 503")
    finally:
        gateway.process.stop()


def test_tiers_limit_models_requests_and_tokens_before_triton(triton_server, tmp_path_factory):
    """403 for a model the tier may not use; 429 when a key's requests per
    second run out, and when a long stream left the key in token debt: each
    with Retry-After and OpenAI's x-ratelimit-* headers, before any upstream work."""
    # one request per 20 s (a moving window), not per second: the first request's
    # own generation must not outlast the window, or the second is admitted
    # (seen on a busy 2-core machine, where it took over a second)
    tiers = {
        "paid": {},
        "one_per_20s": {"requests_per_second": 0.05, "allowed_models": ["ensemble"]},
        "one_tps": {"tokens_per_second": 1},
    }  # a 60-token budget per minute
    work = tmp_path_factory.mktemp("gateway-tiers")
    gateway = start_gateway(triton_server, work, f"gateway.tiers={json.dumps(tiers)}")
    store = KeyStore(work / "keys.json")
    one_rps, one_tps = store.create("one_per_20s", label="qps").key, store.create("one_tps", label="tps").key
    try:

        def sdk(key: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)

        with pytest.raises(openai.PermissionDeniedError) as denied:
            sdk(one_rps).chat.completions.create(model="llm_bls", messages=MESSAGES, max_tokens=4)
        assert denied.value.status_code == 403 and denied.value.body["param"] == "model"

        sdk(one_rps).chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=4, temperature=0)
        before = scrape_metrics(triton_server.metrics_url).get("nv_inference_request_success", 0.0)
        with pytest.raises(openai.RateLimitError) as qps:
            sdk(one_rps).chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=4)
        headers = qps.value.response.headers
        assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-remaining-requests"] == "0", headers
        assert scrape_metrics(triton_server.metrics_url).get("nv_inference_request_success", 0.0) == before

        # a stream is never cut: 64 tokens past a 60-token budget become the key's debt
        stream = sdk(one_tps).chat.completions.create(
            model="ensemble",
            messages=MESSAGES,
            max_tokens=64,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )
        usage = [chunk.usage for chunk in stream if chunk.usage][0]
        assert usage.completion_tokens == 64 and usage.prompt_tokens + 64 > 60
        before_debt = scrape_metrics(triton_server.metrics_url).get("nv_inference_request_success", 0.0)
        with pytest.raises(openai.RateLimitError) as tps:
            sdk(one_tps).chat.completions.create(model="ensemble", messages=MESSAGES, max_tokens=4)
        headers = tps.value.response.headers
        print(
            f"\n[token debt: {usage.prompt_tokens + usage.completion_tokens} tokens against a 60-token budget; "
            f"next request 429, Retry-After {headers['retry-after']} s]"
        )
        assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-remaining-tokens"] == "0", headers
        after = scrape_metrics(triton_server.metrics_url).get("nv_inference_request_success", 0.0)
        assert after == before_debt, "a 429 reached Triton"
        metrics = httpx.get(gateway.process.metrics_url).text
        assert 'gateway_rate_limited_total{kind="qps",tier="one_per_20s"} 1.0' in metrics, metrics[-3000:]
        assert 'gateway_rate_limited_total{kind="tps",tier="one_tps"} 1.0' in metrics
    finally:
        gateway.process.stop()
