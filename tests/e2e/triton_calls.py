"""Plain calls to the real server for end-to-end tests: SSE via httpx +
httpx-sse, gRPC via tritonclient, metrics scraping. Deliberately independent of
the project's client library so these tests check the server, not the client."""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
from httpx_sse import connect_sse
from tritonclient.utils import np_to_triton_dtype

CHAT_PARIS = json.dumps([{"role": "user", "content": "What is the capital of France?"}])


@dataclass
class StreamResult:
    deltas: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    status: int = 200
    final_flags: list[bool] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def finish_reason(self) -> str | None:
        for event in reversed(self.events):
            reason = event.get("finish_reason")
            if isinstance(reason, list):
                reason = reason[0] if reason else None
            if reason:
                return reason
        return None


def sse_stream(http_url: str, model: str, body: dict[str, Any], timeout: float = 120.0) -> StreamResult:
    result = StreamResult()
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "POST", f"{http_url}/v2/models/{model}/generate_stream", json=body) as source:
            result.status = source.response.status_code
            if result.status != 200 and "text/event-stream" not in source.response.headers.get("content-type", ""):
                result.error = source.response.read().decode(errors="replace")
                return result
            for sse in source.iter_sse():
                event = json.loads(sse.data)
                if "error" in event:
                    result.error = event["error"]
                    break
                result.events.append(event)
                text = event.get("text_output", "")
                result.deltas.append(text[0] if isinstance(text, list) else text)
    return result


def generate(http_url: str, model: str, body: dict[str, Any], timeout: float = 120.0) -> tuple[int, dict[str, Any]]:
    response = httpx.post(f"{http_url}/v2/models/{model}/generate", json=body, timeout=timeout)
    return response.status_code, response.json()


def _grpc_input(name: str, value: Any) -> grpcclient.InferInput:
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (str, bytes)):
        array = np.array([[value.encode() if isinstance(value, str) else value]], dtype=np.object_)
    elif isinstance(value, bool):
        array = np.array([[value]], dtype=np.bool_)
    elif isinstance(value, int):
        array = np.array([[value]], dtype=np.int32)
    elif isinstance(value, float):
        array = np.array([[value]], dtype=np.float32)
    elif isinstance(value, list):
        array = np.array([[w.encode() for w in value]], dtype=np.object_)
    else:
        raise TypeError(f"{name}: cannot send {type(value)}")
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def grpc_stream(
    grpc_url: str,
    model: str,
    inputs: dict[str, Any],
    timeout: float = 120.0,
    request_id: str = "",
    outputs: list[str] | None = None,
) -> StreamResult:
    result = StreamResult()
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        requested = [grpcclient.InferRequestedOutput(n) for n in outputs] if outputs else None
        client.async_stream_infer(
            model,
            [_grpc_input(k, v) for k, v in inputs.items()],
            request_id=request_id,
            outputs=requested,
            enable_empty_final_response=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            res, err = responses.get(timeout=max(0.1, deadline - time.monotonic()))
            if err is not None:
                result.error = str(err)
                break
            final = res.get_response().parameters["triton_final_response"].bool_param
            event = {}
            for out in res.get_response().outputs:
                array = res.as_numpy(out.name)
                if array is None:
                    continue
                flat = array.reshape(-1)
                if array.dtype == np.object_:
                    event[out.name] = [v.decode() for v in flat]
                else:
                    event[out.name] = flat.tolist()
            result.final_flags.append(final)
            if event:
                result.events.append(event)
                text = event.get("text_output", [""])
                result.deltas.append(text[0] if text else "")
            if final:
                break
    finally:
        client.stop_stream()
        client.close()
    return result


_SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|\+Inf|-Inf)$")


def scrape_metrics(metrics_url: str) -> dict[str, float]:
    """name{labels} -> value, plus plain `name` summed over label sets."""
    text = httpx.get(metrics_url, timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        name, labels, raw = m.group(1), m.group(2) or "", m.group(3)
        value = float(raw)
        values[name + labels] = value
        if 'le="' not in labels:
            values[name] = values.get(name, 0.0) + value if labels else value
    return values


def histogram_buckets(metrics_url: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of one histogram, summed over label sets."""
    buckets: dict[float, float] = {}
    for key, value in scrape_metrics(metrics_url).items():
        if key.startswith(name + "_bucket{"):
            le = re.search(r'le="([^"]+)"', key).group(1)
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + value
    return buckets


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05) -> float:
    """Poll until predicate() is true; return the seconds it took. Fails loudly."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


# --- text path helpers ------------------------------------------------------

SPECIAL_TOKEN_TEXTS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")


def chat(*contents: str) -> str:
    """A `messages` input: alternating user / assistant turns, user first."""
    roles = ("user", "assistant")
    return json.dumps([{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)], ensure_ascii=False)


def _as_list(value: Any) -> list[Any]:
    # generate_stream JSON flattens a one-element output to a scalar
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def event_output_ids(event: dict[str, Any]) -> list[int]:
    return [int(v) for v in _as_list(event.get("output_ids"))]


def event_num_output_tokens(event: dict[str, Any]) -> int:
    return sum(int(v) for v in _as_list(event.get("num_output_tokens")))


def stream_output_ids(result: StreamResult) -> list[int]:
    return [i for event in result.events for i in event_output_ids(event)]


def stream_num_output_tokens(result: StreamResult) -> int:
    return sum(event_num_output_tokens(event) for event in result.events)


def send_stop(
    http_url: str,
    request_key: str | None = None,
    request_id: str | None = None,
    model: str = "python_llm",
    timeout: float = 30.0,
) -> httpx.Response:
    """A `stop` to the LLM step (through `generate`, since Triton's `infer`
    refuses decoupled models): by the request key, and/or by the Triton
    request id as TensorRT-LLM clients do (which this stack refuses)."""
    body: dict[str, Any] = {"input_ids": [0], "input_lengths": [1], "request_output_len": [1], "stop": True}
    if request_key is not None:
        body["request_key"] = request_key
    if request_id is not None:
        body["id"] = request_id
    return httpx.post(f"{http_url}/v2/models/{model}/generate", json=body, timeout=timeout)


def sse_stream_cancelled(
    http_url: str,
    model: str,
    body: dict[str, Any],
    on_first: Callable[[], None],
    go: threading.Event,
    send_stop_for_key: bool = False,
    timeout: float = 120.0,
) -> StreamResult:
    """Read the first event, call `on_first`, wait for `go`, then cancel: by
    closing the connection, or (`send_stop_for_key`) by sending `stop` with
    body["request_key"] and reading the stream to its end."""
    result = StreamResult()
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "POST", f"{http_url}/v2/models/{model}/generate_stream", json=body) as source:
            result.status = source.response.status_code
            events = source.iter_sse()
            for sse in events:
                result.events.append(json.loads(sse.data))
                break
            on_first()
            if not go.wait(timeout):
                raise TimeoutError("cancel signal never came")
            if not send_stop_for_key:
                return result  # leaving the with-blocks closes the connection
            stop = send_stop(http_url, body["request_key"])
            if stop.status_code != 200:
                result.error = f"stop answered {stop.status_code}: {stop.text}"
                return result
            for sse in events:
                event = json.loads(sse.data)
                if "error" in event:
                    result.error = event["error"]
                    break
                result.events.append(event)
    return result


def grpc_stream_cancelled(
    grpc_url: str,
    model: str,
    inputs: dict[str, Any],
    on_first: Callable[[], None],
    go: threading.Event,
    timeout: float = 120.0,
) -> StreamResult:
    """Read the first response, call `on_first`, wait for `go`, then cancel
    the request through gRPC (`stop_stream(cancel_requests=True)`)."""
    result = StreamResult()
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    cancelled = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, [_grpc_input(k, v) for k, v in inputs.items()], enable_empty_final_response=True
        )
        res, err = responses.get(timeout=timeout)
        if err is not None:
            result.error = str(err)
            return result
        text = res.as_numpy("text_output")
        result.events.append({"text_output": [] if text is None else [v.decode() for v in text.reshape(-1)]})
        on_first()
        if not go.wait(timeout):
            raise TimeoutError("cancel signal never came")
        client.stop_stream(cancel_requests=True)
        cancelled = True
    finally:
        if not cancelled:
            client.stop_stream(cancel_requests=True)
        client.close()
    return result
