"""The client library against the real tritonserver."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from client import AsyncLLMClient, ClientConfig, TimeoutConfig, TokenTimeoutError

pytestmark = pytest.mark.e2e
PARIS = [{"role": "user", "content": "What is the capital of France?"}]


def config(server, transport: str, model: str, **timeouts) -> ClientConfig:
    url = server.http_url if transport == "sse" else server.grpc_url
    return ClientConfig(url=url, transport=transport, model=model, timeouts=TimeoutConfig(**timeouts))


def kv_blocks_used(metrics_url: str) -> float:
    url = metrics_url if metrics_url.rstrip("/").endswith("/metrics") else metrics_url.rstrip("/") + "/metrics"
    text = httpx.get(url, timeout=5).text
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("llm_kv_cache_blocks_used")
    ]
    if not values:
        raise AssertionError("llm_kv_cache_blocks_used is missing from the metrics")
    return sum(values)


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_sse_and_grpc_give_identical_greedy_text(triton_server, model):
    async def both() -> list:
        results = []
        for transport in ("sse", "grpc"):
            async with AsyncLLMClient(config(triton_server, transport, model)) as client:
                results.append(
                    await client.generate("", messages=PARIS, max_tokens=24, temperature=0.0, return_output_ids=True)
                )
        return results

    sse, grpc = asyncio.run(both())
    print(f"\n[{model}] sse: {sse.text!r} ttft={sse.ttft_s:.3f}s | grpc ttft={grpc.ttft_s:.3f}s")
    assert sse.text and sse.text == grpc.text
    assert "Paris" in sse.text
    assert sse.finish_reason == grpc.finish_reason and sse.finish_reason in ("stop", "length")
    assert sse.output_ids == grpc.output_ids and sse.num_output_tokens == len(sse.output_ids)
    assert sse.ttft_s is not None and grpc.ttft_s is not None and sse.ttft_s <= sse.e2e_s


@pytest.mark.parametrize("transport", ["sse", "grpc"])
def test_per_token_timeout_fires_against_a_stalled_server(triton_server, transport):
    async def stalled() -> tuple[float, object]:
        cfg = config(triton_server, transport, "ensemble", token_s=1.0, stop_s=2.0)
        async with AsyncLLMClient(cfg) as client:
            stream = client.stream("Count from one to one hundred.", max_tokens=48, ignore_eos=True)
            stalled_at = None
            try:
                async for _ in stream:
                    if stream.result.num_responses == 2:
                        os.kill(triton_server.pid, signal.SIGSTOP)
                        stalled_at = time.monotonic()
            except TokenTimeoutError as exc:
                assert stalled_at is not None, "timed out before the server was stopped"
                return time.monotonic() - stalled_at, exc.result
            finally:
                os.kill(triton_server.pid, signal.SIGCONT)
            raise AssertionError("the stream finished although the server was stopped")

    waited, result = asyncio.run(stalled())
    print(f"\n[{transport}] per-token timeout raised {waited:.2f}s after SIGSTOP")
    assert 1.0 <= waited < 1.0 + 2.0 + 2.0  # the limit, plus the (failing) stop and slack
    assert result.finish_reason == "timeout" and result.num_responses >= 2


@pytest.mark.parametrize("transport", ["sse", "grpc"])
@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_cancelled_stream_frees_kv_blocks(triton_server, model, transport):
    idle = kv_blocks_used(triton_server.metrics_url)

    async def cancel_mid_stream() -> float:
        async with AsyncLLMClient(config(triton_server, transport, model)) as client:
            stream = client.stream("Write a very long story about the sea.", max_tokens=400, ignore_eos=True)
            got_tokens = asyncio.Event()

            async def consume() -> None:
                async for _ in stream:
                    if stream.result.num_responses >= 5:
                        got_tokens.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(got_tokens.wait(), 120)
            busy = kv_blocks_used(triton_server.metrics_url)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert stream.result.finish_reason == "cancelled"
            return busy

    busy = asyncio.run(cancel_mid_stream())
    assert busy > idle, "the running request held no KV blocks: nothing to measure"
    started = time.monotonic()
    while kv_blocks_used(triton_server.metrics_url) > idle:
        assert time.monotonic() - started < 30, f"{model}/{transport}: KV blocks not freed within 30 s"
        time.sleep(0.1)
    print(f"\n[{model}/{transport}] KV blocks back to idle {time.monotonic() - started:.2f}s after cancel")
