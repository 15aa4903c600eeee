"""The engine behind `python_llm` on the real server, called
directly (TensorRT-LLM's tensors), frees, preempts, rejects and times out."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from httpx_sse import connect_sse
from tokenizers import Tokenizer

from tests.e2e.triton_calls import grpc_stream, scrape_metrics, sse_stream, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text).ids


def llm_body(ids: list[int], max_tokens: int, **extra) -> dict:
    return {
        "input_ids": ids,
        "input_lengths": [len(ids)],
        "request_output_len": [max_tokens],
        "streaming": True,
        "temperature": 0.0,
        **extra,
    }


def llm_grpc_inputs(ids: list[int], max_tokens: int, **extra) -> dict:
    inputs = {
        "input_ids": np.asarray([ids], dtype=np.int32),
        "input_lengths": np.asarray([[len(ids)]], dtype=np.int32),
        "request_output_len": np.asarray([[max_tokens]], dtype=np.int32),
        "streaming": np.asarray([[True]], dtype=np.bool_),
        "temperature": np.asarray([[0.0]], dtype=np.float32),
    }
    for name, value in extra.items():
        dtype = np.bool_ if isinstance(value, bool) else np.int32
        inputs[name] = np.asarray([[value]], dtype=dtype)
    return inputs


def _metric(server, name: str) -> float:
    return scrape_metrics(server.metrics_url).get(name, 0.0)


def test_fifty_cancelled_streams_free_their_blocks(triton_server, tokenizer):
    server = triton_server
    wait_for(lambda: _metric(server, "llm_kv_cache_blocks_used") == 0, 120)
    idle = _metric(server, "llm_kv_cache_blocks_used")
    cancelled_before = _metric(server, "llm_requests_cancelled_total")
    prompt = _ids(tokenizer, "Write a very long story about a lighthouse keeper and the sea.")
    started = threading.Barrier(51)
    release = threading.Event()

    def sse_disconnect(i: int) -> None:
        with httpx.Client(timeout=120) as client:
            body = llm_body(prompt + [i % 50 + 100], 400, ignore_eos=True)
            with connect_sse(
                client, "POST", f"{server.http_url}/v2/models/python_llm/generate_stream", json=body
            ) as source:
                for _ in source.iter_sse():
                    break  # one token seen: the request is running
                started.wait(120)
                release.wait(120)
            # leaving the block closes the connection mid-stream

    def grpc_cancel(i: int) -> None:
        got_first: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error: got_first.put(error))
        inputs = []
        for name, array in llm_grpc_inputs(prompt + [i % 50 + 200], 400, ignore_eos=True).items():
            t = grpcclient.InferInput(
                name,
                list(array.shape),
                "BOOL" if array.dtype == np.bool_ else "FP32" if array.dtype == np.float32 else "INT32",
            )
            t.set_data_from_numpy(array)
            inputs.append(t)
        client.async_stream_infer("python_llm", inputs)
        assert got_first.get(timeout=120) is None
        started.wait(120)
        release.wait(120)
        client.stop_stream(cancel_requests=True)
        client.close()

    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(sse_disconnect if i < 25 else grpc_cancel, i) for i in range(50)]
        started.wait(180)  # all 50 have streamed a token
        busy = _metric(server, "llm_kv_cache_blocks_used")
        assert busy > idle, (busy, idle)
        t0 = time.monotonic()
        release.set()
        for f in futures:
            f.result(timeout=120)
    took = wait_for(lambda: _metric(server, "llm_kv_cache_blocks_used") == idle, 60)
    freed_s = time.monotonic() - t0
    wait_for(lambda: _metric(server, "llm_requests_cancelled_total") >= cancelled_before + 50, 60)
    print(
        f"\n[50 cancels: blocks {busy:.0f} -> {idle:.0f} in {freed_s:.2f} s after the cancels "
        f"({took:.2f} s of polling)]"
    )
    assert _metric(server, "llm_requests_cancelled_total") == cancelled_before + 50


def test_prefix_cache_hits_for_a_shared_long_prompt(triton_server, tokenizer):
    server = triton_server
    shared = _ids(tokenizer, "You are a meticulous assistant. " * 20)  # > 100 tokens
    block = 16
    before = _metric(server, "llm_prefix_cache_hit_tokens_total")
    for suffix in ("Say hi.", "Say bye."):
        ids = shared + _ids(tokenizer, suffix)
        r = sse_stream(server.http_url, "python_llm", llm_body(ids, 4))
        assert r.error is None, r.error
    hits = _metric(server, "llm_prefix_cache_hit_tokens_total") - before
    full_blocks = len(shared) // block
    assert hits >= full_blocks * block, (hits, full_blocks * block)


def test_per_token_timeout_ends_the_request(triton_server, tokenizer):
    server = triton_server
    before = _metric(server, "llm_requests_timed_out_total")
    ids = _ids(tokenizer, "Count from one to one hundred.")
    # no step on this CPU produces a token within 1 ms
    r = grpc_stream(server.grpc_url, "python_llm", llm_grpc_inputs(ids, 64, token_timeout_ms=1))
    assert r.error is None, r.error
    assert r.events[-1]["finish_reason"] == ["timeout"]
    assert _metric(server, "llm_requests_timed_out_total") == before + 1
    # a generous timeout does not fire
    r = grpc_stream(server.grpc_url, "python_llm", llm_grpc_inputs(ids, 8, token_timeout_ms=60000))
    assert r.events[-1]["finish_reason"] == ["length"]


@pytest.fixture(scope="module")
def small_kv_server(start_triton):
    """32 KV blocks of 16 tokens."""
    server = start_triton(max_tokens_in_paged_kv_cache=512, max_num_seqs=8)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def short_queue_server(start_triton):
    """Two sequences at a time, four more may wait."""
    server = start_triton(max_queue_size=4, max_num_seqs=2)
    yield server
    server.stop()


def test_burst_beyond_kv_capacity_completes_through_preemption(small_kv_server, tokenizer):
    server = small_kv_server
    preempted_before = _metric(server, "llm_preemptions_total")
    prompt = _ids(tokenizer, "Tell me about the history of Rome.")  # ~8 tokens
    # 8 requests x (9 + 120) tokens = 72 blocks over time on a 32-block cache
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda i: sse_stream(server.http_url, "python_llm", llm_body(prompt + [300 + i], 120, ignore_eos=True)),
                range(8),
            )
        )
    for r in results:
        assert r.error is None, r.error
        assert sum(np.asarray(e["output_ids"]).size for e in r.events) == 120
    assert _metric(server, "llm_preemptions_total") > preempted_before
    assert _metric(server, "llm_kv_cache_blocks_used") == 0


def test_burst_past_the_queue_is_rejected_fast_and_the_rest_complete(short_queue_server, tokenizer):
    server = short_queue_server
    rejected_before = _metric(server, "llm_requests_rejected_total")
    prompt = _ids(tokenizer, "Name a color.")

    def one(i: int):
        t0 = time.monotonic()
        r = sse_stream(server.http_url, "python_llm", llm_body(prompt + [400 + i], 24, ignore_eos=True))
        return r, time.monotonic() - t0

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(one, range(24)))
    rejected = [(r, t) for r, t in results if r.error and "overloaded:" in r.error]
    completed = [r for r, _ in results if r.error is None]
    assert rejected, "expected some overloaded: rejections"
    assert len(rejected) + len(completed) == 24, [r.error for r, _ in results if r.error]
    slowest_rejection = max(t for _, t in rejected)
    print(
        f"\n[{len(rejected)} rejected (slowest answer {slowest_rejection * 1000:.0f} ms), {len(completed)} completed]"
    )
    assert slowest_rejection < 10.0, "a rejection must not wait for capacity"
    assert _metric(server, "llm_requests_rejected_total") == rejected_before + len(rejected)


def test_engine_failure_fails_requests_and_the_server_exits_non_zero(start_triton, tokenizer):
    server = start_triton(debug_fail_after_steps=3, exit_on_engine_failure_s=0.5)
    try:
        r = sse_stream(server.http_url, "python_llm", llm_body(_ids(tokenizer, "Hello there"), 32, ignore_eos=True))
        assert r.error is not None and "engine failed: RuntimeError: injected failure" in r.error, r.error
        assert len(r.events) <= 3  # the stream ended, with an error, after 3 steps
        process = server.process
        assert process is not None
        t0 = time.monotonic()
        code = process.wait(timeout=60)
        print(f"\n[server exited with {code} {time.monotonic() - t0:.2f} s after the error response]")
        assert code != 0
    finally:
        server.stop()
