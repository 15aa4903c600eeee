"""The real Triton stack end to end on the default model: streaming over SSE,
gRPC and generate, batching, bad requests, metrics, the server's allocator."""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from serving.allocator import find_tcmalloc
from tests.e2e.triton_calls import CHAT_PARIS, generate, grpc_stream, histogram_buckets, scrape_metrics, sse_stream

pytestmark = pytest.mark.e2e

GREEDY = {"max_tokens": 32, "temperature": 0.0}


def _sse_body(**extra):
    return {"text_input": "", "messages": CHAT_PARIS, "stream": True, **GREEDY, **extra}


def test_paris_streams_identically_over_sse_grpc_and_generate(triton_server):
    sse = sse_stream(triton_server.http_url, "ensemble", _sse_body())
    assert sse.error is None, sse.error
    assert "Paris" in sse.text
    assert len(sse.deltas) > 3, "expected a real stream of deltas"
    assert sse.finish_reason == "stop"

    grpc = grpc_stream(
        triton_server.grpc_url, "ensemble", {"text_input": "", "messages": CHAT_PARIS, "stream": True, **GREEDY}
    )
    assert grpc.error is None, grpc.error
    assert grpc.text == sse.text
    assert grpc.final_flags[-1] is True
    # the final flag rides on real data, not on an extra empty response
    assert grpc.events[-1].get("finish_reason") == ["stop"]
    assert grpc.final_flags.count(True) == 1

    status, whole = generate(
        triton_server.http_url, "ensemble", {"text_input": "", "messages": CHAT_PARIS, "stream": False, **GREEDY}
    )
    assert status == 200, whole
    assert whole["text_output"] == sse.text


def test_sixteen_concurrent_streams_share_forward_passes(triton_server):
    alone = sse_stream(triton_server.http_url, "ensemble", _sse_body())
    assert alone.error is None
    before = histogram_buckets(triton_server.metrics_url, "llm_batch_size")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: sse_stream(triton_server.http_url, "ensemble", _sse_body()), range(16)))
    for r in results:
        assert r.error is None, r.error
        assert r.text == alone.text

    after = histogram_buckets(triton_server.metrics_url, "llm_batch_size")

    # steps that ran with >= 8 sequences: all observations minus those <= 7
    def at_least_8(b: dict[float, float]) -> float:
        return b[float("inf")] - b[7.0]

    assert at_least_8(after) - at_least_8(before) > 0, (before, after)


BAD_REQUESTS = [
    ("missing text_input", {"max_tokens": 8}, "text_input"),
    ("max_tokens zero", {"text_input": "hi", "max_tokens": 0}, "max_tokens"),
    ("max_tokens negative", {"text_input": "hi", "max_tokens": -3}, "max_tokens"),
    ("max_tokens above limit", {"text_input": "hi", "max_tokens": 100000}, "max_tokens"),
    ("empty prompt", {"text_input": "", "max_tokens": 8}, "text_input"),
    ("prompt longer than context", {"text_input": "hello " * 9000, "max_tokens": 8}, "text_input"),
    ("messages not JSON", {"text_input": "", "messages": "[{not json", "max_tokens": 8}, "messages"),
]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("case,body,field", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_400_naming_the_field(triton_server, endpoint, case, body, field):
    response = httpx.post(f"{triton_server.http_url}/v2/models/ensemble/{endpoint}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    text = response.text
    if endpoint == "generate_stream" and text.startswith("data:"):
        text = text.split("data:", 1)[1]
    message = json.loads(text)["error"]
    assert field in message, message
    assert triton_server.is_ready()


def _grpc_error(triton_server, inputs: list[grpcclient.InferInput]) -> str:
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer("ensemble", inputs)
        res, err = responses.get(timeout=60)
        assert res is None and err is not None, "expected an error before any data"
        return str(err)
    finally:
        client.stop_stream()
        client.close()


def _tensor(name: str, array: np.ndarray, dtype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def test_grpc_wrong_dtype_and_non_utf8_are_rejected(triton_server):
    text = _tensor("text_input", np.array([[b"hi"]], dtype=np.object_), "BYTES")
    wrong_dtype = _tensor("max_tokens", np.array([[8]], dtype=np.int64), "INT64")
    message = _grpc_error(triton_server, [text, wrong_dtype])
    assert "max_tokens" in message and "INT32" in message.upper(), message

    bad_bytes = _tensor("text_input", np.array([[b"\xff\xfe caf\xe9"]], dtype=np.object_), "BYTES")
    message = _grpc_error(triton_server, [bad_bytes])
    assert "text_input" in message and "UTF-8" in message, message
    assert triton_server.is_ready()
    # and it still serves
    ok = grpc_stream(triton_server.grpc_url, "ensemble", {"text_input": "Hello", "max_tokens": 4, "temperature": 0.0})
    assert ok.error is None and ok.final_flags[-1]


def test_engine_metrics_are_exported(triton_server):
    values = scrape_metrics(triton_server.metrics_url)
    for name in (
        "llm_kv_cache_blocks_capacity",
        "llm_kv_cache_blocks_used",
        "llm_num_requests_running",
        "llm_generation_tokens_total",
        "llm_time_to_first_token_seconds_count",
    ):
        assert name in values, name
    assert values["llm_kv_cache_blocks_capacity"] > 0


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (the Python stubs tritonserver starts)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # the field after the parenthesised name (which may hold spaces): state, then ppid
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a process that ended meanwhile
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def test_the_server_and_its_stubs_run_on_tcmalloc(triton_server):
    library = find_tcmalloc()
    assert library is not None, "tcmalloc: not unpacked (`make tools` unpacks it into build/tools)"
    stubs = _descendants(triton_server.pid)
    # preprocessing, python_llm, postprocessing, llm_bls: a stub each at least
    assert len(stubs) >= 4, stubs
    for pid in (triton_server.pid, *stubs):
        mapped = Path(f"/proc/{pid}/maps").read_text()
        assert str(library.resolve()) in mapped, f"pid {pid} does not map {library.resolve()}"
