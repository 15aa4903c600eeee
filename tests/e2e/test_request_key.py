"""Only the requester stops its request: a `stop` must carry the request key.
A stop by request id alone, or with a wrong key, changes nothing and says so;
the right key ends the request, running or still queued, and its KV blocks
return. On the real server, through `ensemble`, `llm_bls` and `python_llm`."""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from httpx_sse import connect_sse

from tests.e2e.triton_calls import CHAT_PARIS, generate, scrape_metrics, send_stop, wait_for

pytestmark = pytest.mark.e2e

IDLE_TIMEOUT_S = 120.0
# long enough that nothing ends on its own while the test stops it
LONG = {"max_tokens": 1024, "ignore_eos": True, "temperature": 0.0}


def _key() -> str:
    return secrets.token_urlsafe(24)


def _body(model: str, key: str, request_id: str, stream: bool = True) -> dict:
    if model == "python_llm":  # the LLM step takes token ids under TensorRT-LLM's names
        return {
            "input_ids": list(range(100, 140)),
            "request_output_len": LONG["max_tokens"],
            "ignore_eos": True,
            "temperature": 0.0,
            "streaming": stream,
            "request_key": key,
            "id": request_id,
        }
    return {"text_input": "", "messages": CHAT_PARIS, "stream": stream, "request_key": key, "id": request_id, **LONG}


class OpenStream:
    """A generate_stream request read on a thread, so the test can act on it
    from other connections while it runs."""

    def __init__(self, http_url: str, model: str, body: dict) -> None:
        self.events: list[dict] = []
        self.first = threading.Event()
        self.done = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._read, args=(http_url, model, body), daemon=True)
        self._thread.start()

    def _read(self, http_url: str, model: str, body: dict) -> None:
        try:
            with httpx.Client(timeout=IDLE_TIMEOUT_S) as client:
                with connect_sse(client, "POST", f"{http_url}/v2/models/{model}/generate_stream", json=body) as src:
                    for sse in src.iter_sse():
                        event = json.loads(sse.data)
                        if "error" in event:
                            self.error = event["error"]
                            break
                        self.events.append(event)
                        self.first.set()
        except Exception as exc:  # reported by the test's assertions
            self.error = repr(exc)
        finally:
            self.first.set()
            self.done.set()

    @property
    def finish_reason(self) -> str | None:
        reasons = [e.get("finish_reason") for e in self.events if e.get("finish_reason")]
        return reasons[-1] if reasons else None

    def echoed_keys(self) -> set[str]:
        return {e.get("request_key") or e.get("request_key_out") for e in self.events}

    def join(self) -> None:
        self._thread.join(IDLE_TIMEOUT_S)


def _blocks_used(server) -> float:
    return scrape_metrics(server.metrics_url)["llm_kv_cache_blocks_used"]


def _wait_idle(server, what: str) -> None:
    took = wait_for(lambda: _blocks_used(server) == 0, IDLE_TIMEOUT_S, interval_s=0.1)
    print(f"\n[{what}: KV blocks back to idle in {took:.2f} s]")


def _refused(response: httpx.Response, fragment: str) -> None:
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"], response.text


@pytest.mark.parametrize("model", ["ensemble", "llm_bls", "python_llm"])
def test_only_the_key_stops_a_stream(triton_server, model):
    key, request_id = _key(), f"victim-{uuid.uuid4().hex}"
    stream = OpenStream(triton_server.http_url, model, _body(model, key, request_id))
    assert stream.first.wait(IDLE_TIMEOUT_S) and stream.error is None, stream.error
    assert stream.echoed_keys() == {key}  # every response carries the key back

    # another connection knows the request id (they are guessable), or guesses a key
    _refused(send_stop(triton_server.http_url, request_id=request_id), "request_key: required")
    _refused(send_stop(triton_server.http_url, request_key=_key(), request_id=request_id), "no live request")
    _refused(send_stop(triton_server.http_url, request_key=_key()), "no live request")
    seen = len(stream.events)
    wait_for(lambda: len(stream.events) >= seen + 2, IDLE_TIMEOUT_S)  # it kept streaming
    assert not stream.done.is_set() and stream.finish_reason is None

    t0 = time.monotonic()
    stop = send_stop(triton_server.http_url, request_key=key)
    assert stop.status_code == 200, stop.text
    assert stream.done.wait(IDLE_TIMEOUT_S), "the stream did not end after its key's stop"
    print(
        f"\n[{model}: the key's stop ended the stream in {time.monotonic() - t0:.2f} s "
        f"after {len(stream.events)} responses]"
    )
    stream.join()
    assert stream.error is None and stream.finish_reason == "cancelled", (stream.error, stream.events[-1:])
    _wait_idle(triton_server, f"{model} stopped by key")
    # the key died with its request
    _refused(send_stop(triton_server.http_url, request_key=key), "no live request")


@pytest.fixture(scope="module")
def one_seat_server(start_triton) -> Iterator:
    """One running sequence at a time, so a second request waits in the queue."""
    yield start_triton(max_num_seqs=1)


def test_the_key_stops_a_queued_request_streaming_or_not(one_seat_server):
    server = one_seat_server
    running_key = _key()
    running = OpenStream(server.http_url, "ensemble", _body("ensemble", running_key, f"running-{uuid.uuid4().hex}"))
    assert running.first.wait(IDLE_TIMEOUT_S) and running.error is None, running.error

    queued_key, whole_key = _key(), _key()
    queued = OpenStream(server.http_url, "ensemble", _body("ensemble", queued_key, f"queued-{uuid.uuid4().hex}"))
    with ThreadPoolExecutor(1) as pool:
        # stream: false answers once, at the end: the caller's own key is its only handle
        whole = pool.submit(
            generate, server.http_url, "llm_bls", _body("llm_bls", whole_key, f"whole-{uuid.uuid4().hex}", stream=False)
        )
        wait_for(lambda: scrape_metrics(server.metrics_url)["llm_num_requests_waiting"] == 2, IDLE_TIMEOUT_S)
        assert not queued.first.is_set()  # still waiting for the seat

        _refused(send_stop(server.http_url, request_key=_key()), "no live request")
        t0 = time.monotonic()
        for key in (queued_key, whole_key):
            assert send_stop(server.http_url, request_key=key).status_code == 200
        assert queued.done.wait(IDLE_TIMEOUT_S)
        status, answer = whole.result(IDLE_TIMEOUT_S)
        print(f"\n[two queued requests stopped by key in {time.monotonic() - t0:.2f} s while another ran]")
    assert queued.error is None and queued.finish_reason == "cancelled", (queued.error, queued.events)
    assert status == 200 and answer["finish_reason"] == "cancelled" and answer["request_key"] == whole_key, answer
    assert not running.done.is_set()  # the running one was not touched

    assert send_stop(server.http_url, request_key=running_key).status_code == 200
    assert running.done.wait(IDLE_TIMEOUT_S) and running.finish_reason == "cancelled"
    _wait_idle(server, "queued and running requests stopped by key")
    values = scrape_metrics(server.metrics_url)
    assert values["llm_num_requests_waiting"] == 0 and values["llm_num_requests_running"] == 0
