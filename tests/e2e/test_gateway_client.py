"""The client library through the gateway, against the real stack: the API
key on every request, a stream cut by the network (a TCP proxy that drops the
connection mid-answer) resumed on its own into exactly the uninterrupted
greedy text, and a cancel that is a `DELETE` freeing the KV blocks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from client import AsyncLLMClient, ClientConfig, RequestError
from serving.launcher import TritonServer
from tests.e2e.cutting_proxy import CuttingProxy
from tests.e2e.test_gateway_openai import Gateway, kv_blocks_used, start_gateway
from tests.e2e.triton_calls import wait_for

pytestmark = pytest.mark.e2e

PROMPT = "Write a long story about a lighthouse keeper and the sea."
GREEDY = {"max_tokens": 40, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def gateway(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    started = start_gateway(triton_server, tmp_path_factory.mktemp("client"))
    yield started
    assert started.process.stop() == 0


def generate(url: str, key: str | None, **options: object):
    async def run():
        async with AsyncLLMClient(ClientConfig(url=url, api_key=key)) as client:
            return await client.generate(PROMPT, **{**GREEDY, **options})

    return asyncio.run(run())


def test_the_client_through_the_gateway_equals_triton_direct_and_needs_a_key(gateway, triton_server):
    direct = generate(triton_server.http_url, None)
    through = generate(gateway.root, gateway.key)
    assert direct.error is None and through.error is None, (direct.error, through.error)
    assert through.text == direct.text and through.finish_reason == "length"
    with pytest.raises(RequestError) as refused:
        generate(gateway.root, "sk-not-a-key")
    assert "API key" in refused.value.message


def test_a_stream_cut_by_the_network_is_resumed_into_the_uninterrupted_text(gateway):
    reference = generate(gateway.root, gateway.key)
    port = int(gateway.root.rsplit(":", 1)[1])
    proxy = CuttingProxy(target_port=port, cut_after_events=6).start()
    try:
        started = time.monotonic()
        resumed = generate(f"http://127.0.0.1:{proxy.port}", gateway.key)
        took = time.monotonic() - started
    finally:
        proxy.stop()
    print(
        f"\n[cut after ~6 events, resumed {resumed.resumes}x through {proxy.connections} connections; "
        f"{resumed.num_output_tokens} tokens in {took:.2f} s]"
    )
    assert proxy.cuts == 1, "the proxy never cut the stream: nothing was tested"
    assert resumed.error is None, resumed.error
    assert resumed.resumes == 1
    assert resumed.text == reference.text and resumed.num_output_tokens == reference.num_output_tokens


def test_a_cancel_through_the_gateway_is_a_delete_that_frees_the_kv_blocks(gateway, triton_server):
    idle = kv_blocks_used(triton_server)

    async def cancel_mid_stream() -> float:
        async with AsyncLLMClient(ClientConfig(url=gateway.root, api_key=gateway.key)) as client:
            stream = client.stream(PROMPT, max_tokens=400, temperature=0.0, ignore_eos=True)
            seen = 0
            async for event in stream:
                seen += bool(event.text)
                if seen >= 3:
                    break
            busy = kv_blocks_used(triton_server)
            await stream.aclose()  # the library sends DELETE /v1/streams/{id}
            return busy

    busy = asyncio.run(cancel_mid_stream())
    assert busy > idle, "the running request held no KV blocks: nothing to measure"
    took = wait_for(lambda: kv_blocks_used(triton_server) <= idle, timeout_s=30)
    print(f"\n[client cancel through the gateway: KV blocks idle {took:.2f} s later (grace period 10 s)]")
    assert took < 5, "the cancel waited for the grace period instead of stopping the stream"
