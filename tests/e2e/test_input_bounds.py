"""Inputs that once misbehaved get a 400 naming the field, before any work:
nested, numerous or huge `messages`, a huge `text_input`, a request without
`text_input`, a malformed `request_key`. The server stays ready and logs no
traceback for them."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.e2e.triton_calls import chat

pytestmark = pytest.mark.e2e

DEEP = "[" * 50_000 + "]" * 50_000  # past Python's recursion limit
CASES = [
    ("messages nested past the recursion limit", {"text_input": "", "messages": DEEP}, "messages"),
    ("messages nested past the bound", {"text_input": "", "messages": "[" * 9 + "]" * 9}, "messages"),
    ("too many messages", {"text_input": "", "messages": chat(*(["hi"] * 1025))}, "messages"),
    ("messages over the byte bound", {"text_input": "", "messages": chat("x" * 600_000)}, "messages"),
    ("1 MB text_input", {"text_input": "a b " * 250_000}, "text_input"),
    ("only temperature", {"temperature": 0.0}, "text_input"),
    ("only top_k and stream", {"top_k": 5, "stream": True}, "text_input"),
    ("malformed request_key", {"text_input": "hi", "request_key": "guessable"}, "request_key"),
]


def _error(response: httpx.Response) -> str:
    text = response.text
    if text.startswith("data:"):  # generate_stream answers its 400 as one SSE event
        text = text.split("data:", 1)[1]
    return json.loads(text)["error"]


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("case,body,field", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_400_naming_the_field(triton_server, model, endpoint, case, body, field):
    log_before = len(triton_server.read_log())
    t0 = time.monotonic()
    response = httpx.post(
        f"{triton_server.http_url}/v2/models/{model}/{endpoint}", json={"max_tokens": 8, **body}, timeout=60
    )
    took = time.monotonic() - t0
    assert response.status_code == 400, response.text[:500]
    message = _error(response)
    assert message.removeprefix(f"in ensemble '{model}', ").startswith(f"{field}: "), message
    print(f"\n[{model}/{endpoint} {case}: 400 in {took * 1000:.0f} ms: {message[:120]}]")
    assert triton_server.is_ready()
    new_log = triton_server.read_log()[log_before:]
    assert "Traceback" not in new_log and "RecursionError" not in new_log, new_log[-2000:]
