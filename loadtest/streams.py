"""One streaming request per call, in blocking (gevent-friendly) code for Locust.

Inside Locust everything must cooperate with gevent: SSE uses httpx's sync
client, gRPC the sync `tritonclient.grpc` streaming API (after
`grpc.experimental.gevent.init_gevent()`), never asyncio.
"""

from __future__ import annotations

import json
import queue
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import connect_sse

from client.grpc_transport import build_inputs, is_final, outputs_of
from client.payload import (
    event_from_outputs,
    generate_body,
    grpc_tensors,
    input_values,
    stop_generate_body,
    stop_values,
)
from client.sse_transport import error_message
from client.types import GenerationOptions
from contract.request_key import mint_request_key

from .dataset import Prompt
from .settings import LoadSettings

STOP_MODEL = "python_llm"


@dataclass
class StreamOutcome:
    request_type: str
    request_id: str
    sent_s: float
    token_times_s: list[float] = field(default_factory=list)
    text: str = ""
    end_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None
    cancelled: bool = False
    # the engine's own count (each delta's num_output_tokens), where the server sends it
    server_output_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def itl_s(self) -> list[float]:
        times = self.token_times_s
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.sent_s


@dataclass(frozen=True)
class StreamRequest:
    model: str
    prompt: str
    max_tokens: int
    request_id: str
    cancel_after_tokens: int | None = None  # abandon the stream after this many token-bearing responses
    ignore_eos: bool = False
    chat: bool = False  # send the prompt as a user message (chat template) instead of raw text
    # The secret the stop of an abandoned stream must carry (the server ignores
    # the request id for stops); one per request, never reported or logged.
    request_key: str = field(default_factory=mint_request_key, repr=False)

    def values(self) -> dict[str, Any]:
        messages = [{"role": "user", "content": self.prompt}] if self.chat else None
        options = GenerationOptions(
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos or None,
            request_id=self.request_id,
            messages=messages,
            request_key=self.request_key,
        )
        return input_values("" if self.chat else self.prompt, options, stream=True)

    @property
    def needs_stop(self) -> bool:
        return self.model not in ("llm_bls", STOP_MODEL)


def new_stream_request(settings: LoadSettings, prompt: Prompt, rng: random.Random) -> StreamRequest:
    """A user's next request: a `cancel_share` of them are abandoned after a random
    number of tokens. Each gets a fresh id (it names the request in server logs)
    and a fresh key (the credential its stop must carry), as the client library does."""
    cancel_after = None
    if rng.random() < settings.cancel_share:
        cancel_after = rng.randint(1, max(1, prompt.max_tokens // 2))
    return StreamRequest(
        settings.model,
        prompt.text,
        prompt.max_tokens,
        uuid.uuid4().hex,
        cancel_after,
        chat=settings.chat,
        request_key=mint_request_key(),
    )


def _on_event(outcome: StreamOutcome, outputs: dict[str, Any], at: float) -> None:
    """Record one response."""
    event = event_from_outputs(outputs, at)
    outcome.text += event.text
    outcome.server_output_tokens += event.num_output_tokens or 0
    if event.carries_tokens:
        outcome.token_times_s.append(at)
    if event.finish_reason:
        outcome.finish_reason = event.finish_reason


def run_sse(http: httpx.Client, request: StreamRequest, token_timeout_s: float) -> StreamOutcome:
    outcome = StreamOutcome("SSE", request.request_id, sent_s=time.perf_counter())
    body = generate_body(request.values(), request.request_id)
    try:
        with connect_sse(
            http,
            "POST",
            f"/v2/models/{request.model}/generate_stream",
            json=body,
            timeout=httpx.Timeout(10.0, read=token_timeout_s),
        ) as source:
            if source.response.status_code != 200:
                outcome.error = f"HTTP {source.response.status_code}: {error_message(source.response.read())}"
            else:
                for sse in source.iter_sse():
                    if not sse.data:
                        continue
                    data = json.loads(sse.data)
                    if "error" in data:
                        outcome.error = str(data["error"])
                        break
                    _on_event(outcome, data, time.perf_counter())
                    if _should_cancel(outcome, request):
                        outcome.cancelled = True
                        break
    except (httpx.HTTPError, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.end_s = time.perf_counter()
    if request.needs_stop and (outcome.cancelled or (outcome.error and outcome.token_times_s)):
        _sse_stop(http, request)
    return outcome


def _should_cancel(outcome: StreamOutcome, request: StreamRequest) -> bool:
    return (
        request.cancel_after_tokens is not None
        and outcome.finish_reason is None
        and len(outcome.token_times_s) >= request.cancel_after_tokens
    )


def _sse_stop(http: httpx.Client, request: StreamRequest) -> None:
    body = stop_generate_body(request.request_id, request.request_key)
    try:
        http.post(f"/v2/models/{STOP_MODEL}/generate", json=body, timeout=5.0)
    except httpx.HTTPError:
        pass  # best effort: the request may already have finished


def run_grpc(grpc_client: Any, request: StreamRequest, token_timeout_s: float) -> StreamOutcome:
    """`grpc_client` is a sync `tritonclient.grpc.InferenceServerClient`."""
    outcome = StreamOutcome("gRPC", request.request_id, sent_s=time.perf_counter())
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            request.model,
            build_inputs(grpc_tensors(request.values())),
            request_id=request.request_id,
            enable_empty_final_response=True,
        )
        while True:
            try:
                result, error = responses.get(timeout=token_timeout_s)
            except queue.Empty:
                outcome.error = f"no response for {token_timeout_s}s"
                break
            if error is not None:
                outcome.error = error.message() if hasattr(error, "message") else str(error)
                break
            _on_event(outcome, outputs_of(result), time.perf_counter())
            if is_final(result):
                break
            if _should_cancel(outcome, request):
                outcome.cancelled = True
                break
    except Exception as exc:  # tritonclient raises its own exception types from the stream
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.end_s = time.perf_counter()
        grpc_client.stop_stream(cancel_requests=outcome.cancelled or outcome.error is not None)
    if request.needs_stop and (outcome.cancelled or (outcome.error and outcome.token_times_s)):
        _grpc_stop(grpc_client, request)
    return outcome


def _grpc_stop(grpc_client: Any, request: StreamRequest) -> None:
    answered: queue.Queue[object] = queue.Queue()
    tensors = [(name, datatype, array) for name, (datatype, array) in stop_values(request.request_key).items()]
    grpc_client.start_stream(callback=lambda result, error: answered.put(error))
    try:
        grpc_client.async_stream_infer(
            STOP_MODEL, build_inputs(tensors), request_id=request.request_id, enable_empty_final_response=True
        )
        answered.get(timeout=5.0)
    except Exception:
        pass  # best effort, as above
    finally:
        grpc_client.stop_stream(cancel_requests=True)
