"""Resumable streams against the real stack: a real tritonserver, two real
gateway processes (`python -m gateway serve`) sharing one real redis-server,
real HTTP. A stream whose connection drops mid-way and is resumed with
`Last-Event-ID` (through the same gateway or the other one) yields exactly the
text of an uninterrupted greedy run; a stream nobody resumes is stopped after
its grace period and its KV blocks return to idle; DELETE frees them at once;
another key's resume gets 404. Times are printed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from httpx_sse import connect_sse

from gateway.admission.keys import KeyStore
from serving.gateway_process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.triton_calls import scrape_metrics, wait_for
from tests.unit.gateway.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.e2e

GRACE_S = 3.0
TIERS = {"resumable": {"priority": 5, "stream_grace_s": GRACE_S}}
PROMPT = "Write a long story about a lighthouse keeper and the sea."


@dataclass
class Fleet:
    urls: list[str]
    key: str
    other_key: str
    processes: list[GatewayProcess]


@pytest.fixture(scope="module")
def fleet(
    triton_server: TritonServer,
    redis_server: RedisServer,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("resume")
    store = KeyStore(work / "keys.json")
    key, other = store.create("resumable").key, store.create("resumable").key
    processes, urls = [], []
    for index, port in enumerate(free_local_ports(2)):
        process = GatewayProcess(
            [
                f"gateway.port={port}",
                "gateway.host=127.0.0.1",
                "gateway.public_grpc_port=0",
                f"gateway.fleet.upstream_grpc_url={triton_server.grpc_url}",
                f"gateway.keys_file={store.path}",
                f"gateway.redis_url={redis_server.url}",
                f"gateway.tiers={json.dumps(TIERS)}",
            ],
            log_path=work / f"gateway{index}.log",
            port=port,
        )
        process.start()
        processes.append(process)
        urls.append(f"http://127.0.0.1:{port}")
    yield Fleet(urls, key, other, processes)
    for process in processes:
        assert process.stop() == 0


def body(max_tokens: int) -> dict:
    return {
        "model": "ensemble",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }


def text_of(data: list[str]) -> str:
    return "".join(json.loads(d)["choices"][0]["text"] for d in data if d != "[DONE]")


def read_events(
    url: str,
    key: str,
    method: str,
    path: str,
    *,
    stop_after: int | None = None,
    last_event_id: int | None = None,
    payload: dict | None = None,
) -> tuple[str, list[int], list[str]]:
    """(stream id, event ids, data) of one SSE exchange; with `stop_after`, the
    connection is closed after that many events (the client drops)."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    ids, data = [], []
    with httpx.Client(timeout=120) as client:
        with connect_sse(client, method, url + path, json=payload, headers=headers) as source:
            assert source.response.status_code == 200, source.response.read()
            stream_id = source.response.headers["x-stream-id"]
            for sse in source.iter_sse():
                if not sse.data:
                    continue
                ids.append(int(sse.id))
                data.append(sse.data)
                if stop_after is not None and len(data) >= stop_after:
                    break
    return stream_id, ids, data


def kv_blocks_used(triton: TritonServer) -> float:
    return scrape_metrics(triton.metrics_url)["llm_kv_cache_blocks_used"]


@pytest.mark.parametrize("resume_on", [0, 1], ids=["same_gateway", "other_gateway_via_redis"])
def test_a_dropped_stream_resumed_with_last_event_id_equals_an_uninterrupted_run(fleet, resume_on):
    _, _, whole = read_events(fleet.urls[0], fleet.key, "POST", "/v1/completions", payload=body(40))
    reference = text_of(whole)
    stream_id, first_ids, first = read_events(
        fleet.urls[0], fleet.key, "POST", "/v1/completions", payload=body(40), stop_after=5
    )
    dropped = time.monotonic()
    with httpx.Client(timeout=30) as client:
        foreign = client.get(
            f"{fleet.urls[resume_on]}/v1/streams/{stream_id}",
            headers={"Authorization": f"Bearer {fleet.other_key}", "Last-Event-ID": str(first_ids[-1])},
        )
    assert foreign.status_code == 404, foreign.text
    _, rest_ids, rest = read_events(
        fleet.urls[resume_on], fleet.key, "GET", f"/v1/streams/{stream_id}", last_event_id=first_ids[-1]
    )
    print(
        f"\n[resume via gateway {resume_on}: {len(first)} events, dropped, {len(rest)} more after "
        f"{time.monotonic() - dropped:.2f} s; another key got 404]"
    )
    ids = first_ids + rest_ids
    assert ids == list(range(1, len(ids) + 1)), "events lost or repeated across the resume"
    assert rest[-1] == "[DONE]"
    assert text_of(first + rest) == reference and reference


def test_a_stream_nobody_resumes_is_stopped_after_the_grace_period(fleet, triton_server):
    idle = kv_blocks_used(triton_server)
    read_events(fleet.urls[0], fleet.key, "POST", "/v1/completions", payload=body(400), stop_after=3)
    dropped = time.monotonic()
    busy = kv_blocks_used(triton_server)
    assert busy > idle, "the running request held no KV blocks: nothing to measure"
    assert kv_blocks_used(triton_server) > idle, "stopped at once: the grace period did not hold it"
    wait_for(lambda: kv_blocks_used(triton_server) <= idle, timeout_s=GRACE_S + 60)
    elapsed = time.monotonic() - dropped
    print(f"\n[KV blocks back to idle {elapsed:.2f} s after the drop (grace period {GRACE_S} s)]")
    assert elapsed >= GRACE_S - 0.5, "stopped before the grace period ended"


def test_delete_frees_the_kv_blocks_at_once_through_either_gateway(fleet, triton_server):
    idle = kv_blocks_used(triton_server)
    stream_id, _, _ = read_events(fleet.urls[0], fleet.key, "POST", "/v1/completions", payload=body(400), stop_after=3)
    assert kv_blocks_used(triton_server) > idle
    with httpx.Client(timeout=30) as client:
        foreign = client.delete(
            f"{fleet.urls[1]}/v1/streams/{stream_id}", headers={"Authorization": f"Bearer {fleet.other_key}"}
        )
        assert foreign.status_code == 404
        started = time.monotonic()
        deleted = client.delete(
            f"{fleet.urls[1]}/v1/streams/{stream_id}", headers={"Authorization": f"Bearer {fleet.key}"}
        )
    assert deleted.status_code == 204, deleted.text
    took = wait_for(lambda: kv_blocks_used(triton_server) <= idle, timeout_s=30)
    print(
        f"\n[DELETE through the other gateway: KV blocks idle {time.monotonic() - started:.2f} s later "
        f"(grace period {GRACE_S} s)]"
    )
    assert took < GRACE_S, "DELETE did not stop the stream before its grace period would have"


def test_a_resume_after_the_end_replays_the_tail_and_an_unknown_stream_is_404(fleet):
    stream_id, ids, data = read_events(fleet.urls[0], fleet.key, "POST", "/v1/completions", payload=body(8))
    assert data[-1] == "[DONE]"
    _, tail_ids, tail = read_events(fleet.urls[1], fleet.key, "GET", f"/v1/streams/{stream_id}", last_event_id=ids[-3])
    assert tail_ids == ids[-2:] and tail == data[-2:]
    with httpx.Client(timeout=30) as client:
        missing = client.get(
            f"{fleet.urls[0]}/v1/streams/strm_unknown", headers={"Authorization": f"Bearer {fleet.key}"}
        )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "stream_not_found"


@pytest.mark.parametrize("resume_on", [0, 1], ids=["same_gateway", "other_gateway_via_redis"])
def test_the_openai_sdk_resumes_a_background_response_with_starting_after(fleet, resume_on):
    """The Responses API's own resume, with the real `openai` SDK and no custom
    code: a background stream read for a while and dropped, then
    `responses.retrieve(id, stream=True, starting_after=N)`."""
    import openai

    def sdk(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.key, max_retries=0)

    request = {"model": "ensemble", "input": PROMPT, "max_output_tokens": 40, "temperature": 0}
    reference = sdk(fleet.urls[0]).responses.create(**request)
    stream = sdk(fleet.urls[0]).responses.create(**request, stream=True, background=True)
    seen = []
    for event in stream:
        seen.append(event)
        if sum(e.type == "response.output_text.delta" for e in seen) >= 5:
            break
    stream.close()
    dropped = time.monotonic()
    response_id = seen[0].response.id
    rest = list(
        sdk(fleet.urls[resume_on]).responses.retrieve(response_id, stream=True, starting_after=seen[-1].sequence_number)
    )
    print(
        f"\n[Responses API via gateway {resume_on}: {len(seen)} events, dropped, {len(rest)} more after "
        f"{time.monotonic() - dropped:.2f} s]"
    )
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == list(range(len(numbers))), "events lost or repeated across the resume"
    text = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    assert rest[-1].type == "response.incomplete" and text == reference.output_text and text
    final = sdk(fleet.urls[resume_on]).responses.retrieve(response_id)
    assert final.output_text == text and final.usage.output_tokens == 40
