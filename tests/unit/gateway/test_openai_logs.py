"""Structured logs: W3C trace context, hashed user ids, one JSON line per
request with its ids, and nothing secret or private at INFO."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from gateway.ops import logs
from tests.unit.gateway.openai_fakes import AUTH, GOOD_KEY, harness, simple_script

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_traceparent_is_continued_only_when_valid():
    assert logs.parse_traceparent(PARENT) == ("0af7651916cd43dd8448eb211c80319c", "01")
    for bad in (
        None,
        "",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # unknown version
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",  # all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",  # all-zero parent
        "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
        "garbage",
    ):
        assert logs.parse_traceparent(bad) is None, bad
    continued = logs.new_context("abc", PARENT)
    assert continued.trace_id == "0af7651916cd43dd8448eb211c80319c" and continued.span_id != "b7ad6b7169203331"
    assert continued.traceparent.startswith("00-0af7651916cd43dd8448eb211c80319c-")
    fresh = logs.new_context(None, "garbage")
    assert len(fresh.trace_id) == 32 and fresh.trace_id != continued.trace_id


def test_a_callers_request_id_is_kept_only_when_printable_and_short():
    assert logs.new_context("req-1", None).caller_request_id == "req-1"
    assert logs.new_context("x" * 129, None).caller_request_id is None
    assert logs.new_context("bad\nid", None).caller_request_id is None


def test_user_ids_are_hashed():
    assert logs.hashed("alice") == logs.hashed("alice") != logs.hashed("bob")
    assert "alice" not in logs.hashed("alice") and len(logs.hashed("alice")) == 16
    assert logs.hashed(None) is None


def test_one_json_access_line_per_request_without_prompt_text_or_keys():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        h = harness(simple_script("Bonjour", " Paris"))
        secret_prompt = "my secret prompt 4711"

        async def go():
            async with h.client() as client:
                return await client.post(
                    "/v1/chat/completions",
                    headers={**AUTH, "x-request-id": "caller-9", "traceparent": PARENT},
                    json={
                        "model": "ensemble",
                        "user": "alice",
                        "messages": [{"role": "user", "content": secret_prompt}],
                    },
                )

        response = asyncio.run(go())
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    text = stream.getvalue()
    assert secret_prompt not in text and "Bonjour" not in text and GOOD_KEY not in text and "alice" not in text
    access = [json.loads(line) for line in text.splitlines() if '"gateway.access"' in line]
    assert len(access) == 1
    entry = access[0]
    assert entry["request_id"] == response.json()["id"].removeprefix("chatcmpl-")
    assert entry["x_request_id"] == "caller-9" and entry["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert (entry["status"], entry["route"], entry["tier"], entry["key_id"]) == (200, "chat", "free", "k1")
    assert (entry["prompt_tokens"], entry["completion_tokens"], entry["outcome"]) == (5, 2, "ok")
    assert entry["user"] == logs.hashed("alice") and entry["upstream_ids"] == [entry["request_id"] + "-0"]


def test_the_serve_command_reads_the_gateway_section_and_names_bad_settings(capsys):
    import pytest

    from gateway.__main__ import load_config

    assert load_config(None, ["gateway.port=9300", "engine.max_num_seqs=2"]).port == 9300
    with pytest.raises(SystemExit, match=r"error: --set: gateway\.nope: no such setting"):
        load_config(None, ["gateway.nope=1"])


def test_the_metrics_scrapes_are_not_logged_at_info_but_are_at_debug():
    saved = logging.getLogger().handlers[:], logging.getLogger().level, logging.getLogger("httpx").level
    try:
        logs.configure("INFO")
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
        assert logging.getLogger("gateway.access").isEnabledFor(logging.INFO)
        logs.configure("DEBUG")
        assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    finally:
        logging.getLogger().handlers[:], level, httpx_level = saved
        logging.getLogger().setLevel(level)
        logging.getLogger("httpx").setLevel(httpx_level)
        logging.getLogger("httpcore").setLevel(logging.NOTSET)
