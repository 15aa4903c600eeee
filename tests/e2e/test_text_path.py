"""The text path end to end on the real server, through both public
entry points (`ensemble` and `llm_bls`), over SSE and gRPC."""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from tests.e2e.triton_calls import (
    CHAT_PARIS,
    SPECIAL_TOKEN_TEXTS,
    StreamResult,
    chat,
    generate,
    grpc_stream,
    grpc_stream_cancelled,
    scrape_metrics,
    sse_stream,
    sse_stream_cancelled,
    stream_num_output_tokens,
    stream_output_ids,
    wait_for,
)

pytestmark = pytest.mark.e2e

ENTRY_POINTS = ["ensemble", "llm_bls"]
GREEDY = {"temperature": 0.0}
# Generous bounds: the machine is shared; the measured times are printed.
IDLE_TIMEOUT_S = 120.0

MIXED_PROMPTS = [
    "What is the capital of France?",
    "用中文介绍一下北京。",
    "Reply with three emoji 😀",
    "请用中文回答：什么是危险？",
    "Write a haiku about the sea.",
    "用一句话描述春天🌸",
    "List three fruits with emoji 🍎🍌",
    "Translate to Chinese: good morning",
]


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _stream(server, model: str, transport: str, body: dict) -> StreamResult:
    body = {"text_input": "", "stream": True, **body}
    if transport == "sse":
        return sse_stream(server.http_url, model, body)
    return grpc_stream(server.grpc_url, model, body)


def _metric(server, name: str) -> float:
    return scrape_metrics(server.metrics_url).get(name, 0.0)


def _wait_kv_idle(server, what: str) -> float:
    took = wait_for(lambda: _metric(server, "llm_kv_cache_blocks_used") == 0, IDLE_TIMEOUT_S, interval_s=0.1)
    print(f"\n[{what}: KV blocks back to idle in {took:.2f} s]")
    return took


def _token_spans(tokenizer: Tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """Character span of each token in the decoded text (for text whose tokens
    each decode to whole characters, checked by the caller)."""
    spans, end = [], 0
    for k in range(1, len(ids) + 1):
        new_end = len(tokenizer.decode(ids[:k], skip_special_tokens=True))
        spans.append((end, new_end))
        end = new_end
    return spans


def _tokens_covering(text: str, word: str, tokenizer: Tokenizer) -> int:
    """How many tokens of `text` (re-encoded) the first `word` in it touches."""
    start = text.index(word)
    end = start + len(word)
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    return sum(1 for a, b in offsets if a < end and b > start)


# -- 1. many mixed-script streams at once ---------------------------------------


def test_64_mixed_script_streams_are_clean_and_match_their_ids(triton_server, tokenizer):
    # every prompt through both entry points and both transports, twice
    cases = [(i, ENTRY_POINTS[(i // 8) % 2], ("sse", "grpc")[(i // 16) % 2], MIXED_PROMPTS[i % 8]) for i in range(64)]

    def run(case):
        _, model, transport, prompt = case
        return _stream(
            triton_server,
            model,
            transport,
            {"messages": chat(prompt), "max_tokens": 24, "return_output_ids": True, **GREEDY},
        )

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(run, cases))
    print(f"\n[64 mixed streams in {time.monotonic() - t0:.1f} s]")

    for (i, model, transport, prompt), r in zip(cases, results):
        where = f"stream {i} ({model}/{transport}, {prompt!r})"
        assert r.error is None, f"{where}: {r.error}"
        assert r.finish_reason in ("stop", "length"), f"{where}: {r.finish_reason}"
        ids = stream_output_ids(r)
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        for delta in r.deltas:
            assert not any(s in delta for s in SPECIAL_TOKEN_TEXTS), f"{where}: special token in {delta!r}"
        for delta in r.deltas[:-1]:
            assert "\ufffd" not in delta, f"{where}: replacement character in {delta!r}"
        # The last delta flushes what was held back; it may end in U+FFFD only
        # where max_tokens cut a character in half (then the ids decode so too).
        cut_char = r.finish_reason == "length" and expected.endswith("\ufffd")
        last = r.deltas[-1].rstrip("\ufffd") if cut_char else r.deltas[-1]
        assert "\ufffd" not in last, f"{where}: replacement character in {r.deltas[-1]!r}"
        generated = stream_num_output_tokens(r)
        assert generated == len(ids) > 0, f"{where}: {generated} counted vs {len(ids)} ids"
        # streamed, not one answer at the end; how many tokens an event
        # carries is the engine's choice under load: with 64 streams it
        # merges a stream's tokens for up to engine.stream_max_hold_ms (engine.stream_response_share)
        assert generated < 2 or len(r.events) >= 2, f"{where}: {len(r.events)} events for {generated} tokens"
        assert r.text == expected, where
    texts = "".join(r.text for r in results)
    # the prompts must really have exercised multi-byte output
    assert any("\u4e00" <= ch <= "\u9fff" for ch in texts), "no Chinese output at all"
    assert any(ord(ch) >= 0x1F300 for ch in texts), "no emoji output at all"


# -- 2. streamed and whole answers agree ----------------------------------------


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_streamed_and_non_streamed_text_are_identical(triton_server, model):
    body = {"text_input": "", "messages": chat("用中文介绍一下北京。"), "max_tokens": 24, **GREEDY}
    streamed = sse_stream(triton_server.http_url, model, {**body, "stream": True})
    status, whole = generate(triton_server.http_url, model, {**body, "stream": False})
    assert streamed.error is None and status == 200, (streamed.error, whole)
    assert len(streamed.deltas) > 3
    assert whole["text_output"] == streamed.text
    assert whole["finish_reason"] == streamed.finish_reason


# -- 3. stop strings across token boundaries ------------------------------------


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_stop_string_across_tokens_stops_and_frees_the_kv(triton_server, tokenizer, model):
    plain = sse_stream(
        triton_server.http_url,
        model,
        {
            "text_input": "",
            "messages": CHAT_PARIS,
            "stream": True,
            "max_tokens": 24,
            "return_output_ids": True,
            **GREEDY,
        },
    )
    assert "France is Paris" in plain.text, plain.text
    ids = stream_output_ids(plain)
    stop = "ance is Pa"
    start = plain.text.index(stop)
    spans = _token_spans(tokenizer, ids)
    assert "".join(plain.text[a:b] for a, b in spans) == plain.text
    boundaries = {a for a, _ in spans}
    # starts and ends inside tokens, so no token-level match can catch it
    assert start not in boundaries and start + len(stop) not in boundaries
    assert sum(1 for a, b in spans if a < start + len(stop) and b > start) >= 3

    generated_before = _metric(triton_server, "llm_generation_tokens_total")
    result = sse_stream(
        triton_server.http_url,
        model,
        {
            "text_input": "",
            "messages": CHAT_PARIS,
            "stream": True,
            "max_tokens": 200,
            "ignore_eos": True,
            "stop_words": [stop],
            **GREEDY,
        },
    )
    assert result.error is None, result.error
    assert result.finish_reason == "stop"
    assert result.text == plain.text[:start]
    assert stop not in result.text
    _wait_kv_idle(triton_server, f"{model} stop string")
    # without the stop the engine would have run to max_tokens (ignore_eos)
    generated = _metric(triton_server, "llm_generation_tokens_total") - generated_before
    print(f"[{model} stop string: the engine generated {generated:.0f} of at most 200 tokens]")
    assert generated < 100, f"the engine generated {generated:.0f} tokens after a stop at token ~6"


# -- 4. the context policy -------------------------------------------------------


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_too_long_conversation_drops_the_oldest_turn(triton_server, model):
    recent = ["My name is Ada.", "Nice to meet you, Ada!", "What is my name?"]
    long_conversation = chat("hello " * 9000, "Hi!", *recent)  # > 8192 tokens
    status, direct = generate(
        triton_server.http_url, model, {"text_input": "", "messages": chat(*recent), "max_tokens": 16, **GREEDY}
    )
    assert status == 200, direct
    status, cut = generate(
        triton_server.http_url, model, {"text_input": "", "messages": long_conversation, "max_tokens": 16, **GREEDY}
    )
    assert status == 200, cut
    # exactly the oldest turn went: the model saw the same prompt as `direct`
    assert cut["num_input_tokens"] == direct["num_input_tokens"] < 200
    assert cut["text_output"] == direct["text_output"] != ""


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_last_turn_that_cannot_fit_is_a_400_naming_messages(triton_server, model, endpoint):
    body = {"text_input": "", "messages": chat("Hi!", "Hello!", "hello " * 9000), "max_tokens": 16}
    response = httpx.post(f"{triton_server.http_url}/v2/models/{model}/{endpoint}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    text = response.text.split("data:", 1)[1] if response.text.startswith("data:") else response.text
    message = json.loads(text)["error"]
    assert "messages" in message and "8192" in message, message


# -- 5. content filter over split Chinese words -------------------------------------

FILTER_CASES = {  # prompt -> (word in its greedy answer, action)
    "请用中文回答：什么是危险？": ("危险", "stop"),
    "用中文介绍一下北京。": ("北京", "mask"),
}


def test_content_filter_catches_chinese_words_split_across_tokens(triton_server, start_triton, tokenizer, tmp_path):
    body = {"text_input": "", "stream": True, "max_tokens": 32, **GREEDY}
    plain = {}
    for prompt, (word, _) in FILTER_CASES.items():
        result = sse_stream(triton_server.http_url, "ensemble", {**body, "messages": chat(prompt)})
        assert word in result.text, f"greedy answer to {prompt!r} lacks {word!r}: {result.text!r}"
        assert _tokens_covering(result.text, word, tokenizer) >= 2, f"{word!r} is a single token"
        plain[prompt] = result.text

    rules = tmp_path / "rules.json"
    rules.write_text(
        json.dumps(
            {"rules": [{"pattern": w, "action": a, "name": f"{a}-rule"} for w, a in FILTER_CASES.values()]},
            ensure_ascii=False,
        )
    )
    server = start_triton(content_filter_rules=str(rules))
    try:
        for model in ENTRY_POINTS:
            for transport in ("sse", "grpc"):
                for prompt, (word, action) in FILTER_CASES.items():
                    where = f"{model}/{transport} {action}"
                    result = _stream(server, model, transport, {**body, "messages": chat(prompt)})
                    assert result.error is None, f"{where}: {result.error}"
                    assert word not in result.text, where
                    if action == "stop":
                        assert result.finish_reason == "content_filter", where
                        assert result.text == plain[prompt][: plain[prompt].index(word)], where
                    else:
                        assert result.finish_reason != "content_filter", where
                        assert result.text == plain[prompt].replace(word, "*" * len(word)), where
        _wait_kv_idle(server, "content filter")
    finally:
        server.stop()


# -- 6. cancellation reaches the engine ----------------------------------------------

Starter = Callable[[Callable[[], None], threading.Event], StreamResult]
LONG = {"max_tokens": 200, "ignore_eos": True, **GREEDY}


def _cancel_wave(server, starters: list[Starter], label: str) -> list[StreamResult]:
    """Start every stream, see the KV in use once all have a first response,
    then cancel them all and wait until the engine is idle again."""
    count = len(starters)
    cancelled_before = _metric(server, "llm_requests_cancelled_total")
    arrived = threading.Semaphore(0)
    go = threading.Event()

    def run(start: Starter) -> StreamResult:
        reported = threading.Event()

        def on_first() -> None:
            reported.set()
            arrived.release()

        try:
            return start(on_first, go)
        finally:
            if not reported.is_set():  # failed early: do not keep the others waiting
                arrived.release()

    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(run, start) for start in starters]
        try:
            for _ in range(count):
                if not arrived.acquire(timeout=IDLE_TIMEOUT_S):
                    raise TimeoutError(f"{label}: not every stream got a first response")
            busy = scrape_metrics(server.metrics_url)
        finally:
            go.set()
            t0 = time.monotonic()
        results = [f.result() for f in futures]
    for r in results:
        assert r.error is None, f"{label}: {r.error}"
    assert busy["llm_kv_cache_blocks_used"] > 0, busy
    assert busy["llm_num_requests_running"] + busy["llm_num_requests_waiting"] == count, busy

    def idle_and_counted() -> bool:
        values = scrape_metrics(server.metrics_url)
        return (
            values["llm_kv_cache_blocks_used"] == 0
            and values["llm_requests_cancelled_total"] - cancelled_before >= count
        )

    wait_for(idle_and_counted, IDLE_TIMEOUT_S, interval_s=0.1)
    print(f"\n[{label}: {count} cancels -> engine idle in {time.monotonic() - t0:.2f} s]")
    assert _metric(server, "llm_requests_cancelled_total") - cancelled_before == count
    return results


def test_cancellation_frees_the_engine_on_both_entry_points(triton_server):
    body = {"text_input": "", "messages": CHAT_PARIS, "stream": True, **LONG}

    def sse_disconnect(on_first, go):
        return sse_stream_cancelled(triton_server.http_url, "llm_bls", body, on_first, go)

    def grpc_cancel(on_first, go):
        return grpc_stream_cancelled(triton_server.grpc_url, "llm_bls", body, on_first, go)

    def ensemble_stop(on_first, go):
        with_key = {**body, "id": f"cancel-{uuid.uuid4().hex}", "request_key": secrets.token_urlsafe(24)}
        return sse_stream_cancelled(triton_server.http_url, "ensemble", with_key, on_first, go, send_stop_for_key=True)

    _cancel_wave(triton_server, [sse_disconnect] * 25 + [grpc_cancel] * 25, "llm_bls")
    results = _cancel_wave(triton_server, [ensemble_stop] * 50, "ensemble")
    for r in results:
        assert r.finish_reason == "cancelled", r.events[-1]
