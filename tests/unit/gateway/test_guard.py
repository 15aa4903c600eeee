"""The body guard: 415, 413 (announced, and chunked without a length: nothing
read past the bound), nesting depth on the raw bytes, and the body handed on."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gateway.bodies.guard import BodyGuard, json_depth

LIMIT = 1000


async def echo_app(scope, receive, send):
    message = await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": message["body"], "more_body": False})


def call(
    chunks: list[bytes],
    headers: list[tuple[bytes, bytes]],
    method: str = "POST",
    depth: int = 4,
    path: str = "/v1/completions",
) -> tuple[int, bytes, int]:
    """(status, body, how many chunks the guard read)."""
    reads = 0
    sent: list[dict] = []

    async def receive():
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": chunks[reads - 1], "more_body": reads < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    asyncio.run(BodyGuard(echo_app, LIMIT, depth)(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), reads


JSON = [(b"content-type", b"application/json; charset=utf-8")]


def test_a_json_body_within_bounds_reaches_the_app_whole():
    status, body, reads = call([b'{"a": ', b"[1, 2]}"], JSON)
    assert (status, body, reads) == (200, b'{"a": [1, 2]}', 2)


@pytest.mark.parametrize(
    "content_type", [None, b"text/plain", b"application/x-www-form-urlencoded", b"application/jsonx"]
)
def test_anything_but_json_is_415(content_type):
    headers = [(b"content-type", content_type)] if content_type else []
    status, body, reads = call([b"{}"], headers)
    assert status == 415 and json.loads(body)["error"]["code"] == "unsupported_media_type" and reads == 0


def test_a_post_without_a_body_needs_no_media_type():
    status, body, _ = call([b""], [(b"content-length", b"0")])
    assert (status, body) == (200, b"")


@pytest.mark.parametrize("content_type", [None, b"application/octet-stream"])
def test_triton_routes_take_what_tritonclient_http_sends(content_type):
    headers = [(b"content-type", content_type)] if content_type else []
    status, body, _ = call([b'{"a": [1]}'], headers, path="/v2/models/ensemble/infer")
    assert (status, body) == (200, b'{"a": [1]}')
    status, _, _ = call([b"{}"], [(b"content-type", b"text/plain")], path="/v2/models/ensemble/infer")
    assert status == 415


def test_the_depth_of_a_binary_data_body_is_that_of_its_json_header():
    header = b'{"a": [1]}'
    tensors = b"[[[[[[[[[[" * 4  # raw tensor bytes that look like deep nesting
    headers = [(b"inference-header-content-length", str(len(header)).encode())]
    status, _, _ = call([header + tensors], headers, path="/v2/models/ensemble/infer", depth=4)
    assert status == 200
    status, _, _ = call([b"[[[[[[" + tensors], headers, path="/v2/models/ensemble/infer", depth=4)
    assert status == 400


def test_an_announced_length_past_the_bound_is_413_before_reading():
    status, body, reads = call([b"x" * 10], JSON + [(b"content-length", str(LIMIT + 1).encode())])
    assert status == 413 and reads == 0 and json.loads(body)["error"]["type"] == "invalid_request_error"


def test_a_chunked_body_is_read_only_up_to_the_bound():
    chunks = [b"x" * 400] * 10
    status, _, reads = call(chunks, JSON)
    assert status == 413 and reads == 3  # 1200 bytes > 1000: the 4th chunk is never asked for


def test_too_deep_json_is_400_without_parsing():
    status, body, _ = call([b'{"a": [[[[1]]]]}'], JSON)
    assert status == 400 and json.loads(body)["error"]["code"] == "json_too_deep"
    assert call([b'{"a": "[[[[[[[[", "b": [1]}'], JSON)[0] == 200  # brackets inside strings do not nest


def test_get_requests_pass_untouched():
    assert call([b""], [], method="GET")[0] == 200


def test_json_depth_counts_nesting_outside_strings_and_escapes():
    assert json_depth(b"") == 0 and json_depth(b"1") == 0 and json_depth(b"[]") == 1
    assert json_depth(b'{"a": [1, {"b": 2}], "c": []}') == 3
    assert json_depth(b'["\\"[[[", [["\\\\"]]]') == 3  # an escaped quote does not end the string
    assert json_depth(b"[[[]]]", bound=2) == 3
    assert json_depth(b"[[1]]", bound=5) <= 5


def test_json_depth_is_linear_on_hostile_input():
    for body in (b'"' + b'\\"' * 400_000, b"[]" * 500_000, b'"' * 1_000_000):
        started = time.perf_counter()
        json_depth(body, bound=32)
        assert time.perf_counter() - started < 2.0
