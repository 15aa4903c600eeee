"""Load-test inputs: shapes, prompt dataset, settings, CLI parsing, and the
blocking SSE stream used inside Locust (against httpx.MockTransport)."""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter

import httpx
import pytest

from loadtest.cli import parse_duration, user_classes
from loadtest.dataset import PromptDataset
from loadtest.settings import DEFAULT_DATASET, LoadSettings
from loadtest.shapes import users_at
from loadtest.streams import StreamRequest, new_stream_request, run_grpc, run_sse
from tests.unit.client.grpc_fakes import by_name, key_of, response
from tests.unit.client.sse_fakes import delta, sse

KEY_FORMAT = re.compile(r"[A-Za-z0-9_-]{32,128}")


def test_steady_ramp_and_burst_shapes():
    steady = LoadSettings(shape="steady", users=4, duration_s=100)
    assert users_at(steady, 0) == (4, 4.0) and users_at(steady, 99.9) == (4, 4.0)
    assert users_at(steady, 100) is None
    ramp = LoadSettings(shape="ramp", users=9, duration_s=100)
    counts = [users_at(ramp, t)[0] for t in (0, 40, 80, 95)]
    assert counts == [1, 5, 9, 9]
    burst = LoadSettings(shape="burst", users=2, burst_factor=20, duration_s=100)
    assert users_at(burst, 10)[0] == 2
    assert users_at(burst, 50) == (40, 40.0)  # a 20x spike, spawned at once
    assert users_at(burst, 70)[0] == 2


def test_dataset_has_both_languages_and_a_long_tail():
    dataset = PromptDataset.from_jsonl(DEFAULT_DATASET, max_tokens=128, seed=1)
    draws = [dataset.sample() for _ in range(2000)]
    langs = Counter(p.lang for p in draws)
    assert langs == {"en": 1321, "zh": 679}  # seed 1: both languages of the dataset are drawn
    lengths = sorted(p.max_tokens for p in draws)
    assert 1 <= lengths[0] and lengths[-1] <= 128
    median, p95 = lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.95)]
    assert 20 <= median <= 45 and p95 >= 2 * median  # median near a quarter of the cap, long tail above
    short = sum(len(p.text) < 60 for p in draws) / len(draws)
    assert 0.5 <= short <= 0.7  # the short bucket's weight is 0.6
    fixed = PromptDataset.from_jsonl(DEFAULT_DATASET, max_tokens=16, fixed_max_tokens=True)
    assert {fixed.sample().max_tokens for _ in range(20)} == {16}


def test_dataset_rejects_bad_lines(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": ""}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        PromptDataset.from_jsonl(path, max_tokens=8)


def test_settings_round_trip_through_the_environment():
    settings = LoadSettings(shape="burst", users=3, cancel_share=0.25, fixed_max_tokens=True, model="llm_bls")
    assert LoadSettings.from_env(settings.to_env()) == settings
    with pytest.raises(ValueError, match=r"^shape must be one of .* \(got 'zigzag'\)$"):
        LoadSettings(shape="zigzag")
    with pytest.raises(ValueError, match=r"^burst_factor must be in \[1, 100\] \(got 500\)$"):
        LoadSettings(burst_factor=500)


def test_prompts_go_out_as_chat_messages_unless_raw():
    chat = StreamRequest("ensemble", "Why is the sky blue?", 8, "c", chat=True).values()
    assert chat["text_input"] == ""
    assert json.loads(chat["messages"]) == [{"role": "user", "content": "Why is the sky blue?"}]
    raw = StreamRequest("ensemble", "Why is the sky blue?", 8, "r").values()
    assert raw["text_input"] == "Why is the sky blue?" and "messages" not in raw
    assert LoadSettings().chat and not LoadSettings.from_env(LoadSettings(chat=False).to_env()).chat


def test_cli_parsing_helpers():
    assert parse_duration("60s") == 60 and parse_duration("2m") == 120 and parse_duration("1h30m") == 5400
    assert parse_duration("45") == 45
    with pytest.raises(argparse.ArgumentTypeError, match=r"^not a duration: 'soon' \(e\.g\. 60s, 2m\)$"):
        parse_duration("soon")
    assert user_classes("sse,grpc", burst_silence=False) == ["SseUser", "GrpcUser"]
    assert user_classes("grpc", burst_silence=True) == ["GrpcBurstSilenceUser"]


def _sse_server(chunks: list[dict], stops: list[dict]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/generate"):
            stops.append(json.loads(request.content))
            return httpx.Response(200, json={})
        body = b"".join(sse(c) for c in chunks)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx.Client(base_url="http://triton.test", transport=httpx.MockTransport(handler))


def test_locust_sse_stream_records_tokens_and_cancels_with_stop():
    chunks = [delta("a "), delta(""), delta("b "), delta("c "), delta("d", finish_reason="length")]
    stops: list[dict] = []
    with _sse_server(chunks, stops) as http:
        done = run_sse(http, StreamRequest("ensemble", "hi", 8, "full"), token_timeout_s=5)
        assert done.text == "a b c d" and done.finish_reason == "length" and not done.cancelled
        assert len(done.token_times_s) == 4 and len(done.itl_s) == 3 and not stops
        cut = run_sse(http, StreamRequest("ensemble", "hi", 8, "cut", cancel_after_tokens=2), token_timeout_s=5)
        assert cut.cancelled and cut.text == "a b " and [s["id"] for s in stops] == ["cut"]
        run_sse(http, StreamRequest("llm_bls", "hi", 8, "bls", cancel_after_tokens=2), token_timeout_s=5)
        assert len(stops) == 1  # llm_bls sees the disconnect itself


def test_locust_sse_stream_reports_http_errors():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "in ensemble 'ensemble', overloaded: full"})

    with httpx.Client(base_url="http://t", transport=httpx.MockTransport(handler)) as http:
        outcome = run_sse(http, StreamRequest("ensemble", "hi", 8, "x"), token_timeout_s=5)
    assert outcome.error == "HTTP 400: in ensemble 'ensemble', overloaded: full" and outcome.ttft_s is None


def test_locust_requests_get_their_own_keys_and_hide_them():
    first, second = StreamRequest("ensemble", "hi", 8, "a"), StreamRequest("ensemble", "hi", 8, "b")
    assert first.request_key != second.request_key
    assert all(KEY_FORMAT.fullmatch(r.request_key) for r in (first, second))
    assert first.values()["request_key"] == first.request_key
    assert first.request_key not in repr(first)
    # What every Locust user's next_request builds (users.py imports locust, which
    # monkey-patches the whole process, so it is not imported here).
    settings, rng = LoadSettings(cancel_share=0.5), random.Random(1)
    dataset = PromptDataset.from_jsonl(DEFAULT_DATASET, max_tokens=8, seed=1)
    requests = [new_stream_request(settings, dataset.sample(), rng) for _ in range(50)]
    assert len({r.request_key for r in requests}) == 50 and len({r.request_id for r in requests}) == 50
    assert all(KEY_FORMAT.fullmatch(r.request_key) for r in requests)
    # cancel_share 0.5 under seed 1: 20 of the 50 draws abandon their stream
    assert sum(r.cancel_after_tokens is not None for r in requests) == 20


def test_locust_sse_stream_sends_the_key_and_stops_with_it():
    streams: list[dict] = []
    stops: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        (stops if request.url.path.endswith("/generate") else streams).append(json.loads(request.content))
        if request.url.path.endswith("/generate"):
            return httpx.Response(200, json={})
        body = b"".join(sse(delta(t)) for t in ("a ", "b ", "c"))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    request = StreamRequest("ensemble", "hi", 8, "cut", cancel_after_tokens=1)
    with httpx.Client(base_url="http://triton.test", transport=httpx.MockTransport(handler)) as http:
        outcome = run_sse(http, request, token_timeout_s=5)
    assert outcome.cancelled and streams[0]["request_key"] == request.request_key
    assert stops == [
        {
            "input_ids": [0],
            "input_lengths": [1],
            "request_output_len": [1],
            "stop": True,
            "request_key": request.request_key,
            "id": "cut",
        }
    ]


class FakeSyncGrpc:
    """The sync tritonclient streaming API as run_grpc uses it, answering from scripts."""

    def __init__(self, scripts: list[list]) -> None:
        self.scripts = scripts
        self.sent: list[dict] = []
        self._callback = None

    def start_stream(self, callback) -> None:
        self._callback = callback

    def async_stream_infer(self, model_name, inputs, request_id="", **kwargs) -> None:
        self.sent.append({"model": model_name, "inputs": by_name(inputs), "request_id": request_id})
        for result in self.scripts.pop(0):
            self._callback(result, None)

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self._callback = None


def test_locust_grpc_stream_sends_the_key_and_stops_with_it():
    grpc = FakeSyncGrpc(
        [[response("a "), response("b "), response("c", "stop", final=True)], [response("", final=True)]]
    )
    request = StreamRequest("ensemble", "hi", 8, "grpc-cut", cancel_after_tokens=1)
    outcome = run_grpc(grpc, request, token_timeout_s=5)
    assert outcome.cancelled and len(grpc.sent) == 2
    stream, stop = grpc.sent
    assert stream["inputs"]["request_key"].shape() == [1, 1]
    assert key_of(stream["inputs"]["request_key"]) == request.request_key
    assert stop["model"] == "python_llm" and stop["request_id"] == "grpc-cut"
    assert stop["inputs"]["stop"].datatype() == "BOOL" and key_of(stop["inputs"]["request_key"]) == request.request_key
