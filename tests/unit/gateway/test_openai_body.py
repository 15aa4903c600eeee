"""What JSON cannot carry, in an OpenAI body, is a 400 naming the field in
OpenAI's `param` (gateway/openai/body.py; the strict JSON itself:
test_strict_json.py), never a 5xx or an unnamed parse error."""

from __future__ import annotations

import asyncio

import pytest

from gateway.openai.body import parse_body
from tests.unit.gateway.openai_fakes import AUTH, harness, simple_script

CHAT = b'"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}]'


@pytest.mark.parametrize(
    "raw, param, words",
    [
        (b"{" + CHAT + b', "user": "\xff\xfe"}', "user", "not valid UTF-8"),
        (
            b'{"model": "ensemble", "messages": [{"role": "user", "content": "a\xc3\x28"}]}',
            "messages[0].content",
            "not valid UTF-8",
        ),
        (b"{" + CHAT + b', "\xff": 1}', "\\udcff", "field name is not valid UTF-8"),
        (b"{" + CHAT + b', "metadata": {"\\udfff": "v"}}', "metadata.\\udfff", "field name is not valid UTF-8"),
        (b"{" + CHAT + b', "temperature": NaN}', "temperature", "finite"),
        (b"{" + CHAT + b', "presence_penalty": 1e400}', "presence_penalty", "finite"),
        (b"{" + CHAT + b', "seed": ' + b"9" * 5000 + b"}", "seed", "5000 digits"),
        (b"{" + CHAT + b', "metadata": {"k": "a", "k": "b"}}', "metadata.k", "given more than once"),
        (b"{" + CHAT + b', "stream_options": "x"}', "stream_options", "valid dictionary"),
    ],
)
def test_a_body_json_cannot_carry_is_a_400_naming_the_field(raw: bytes, param: str, words: str) -> None:
    h = harness(simple_script("x"))

    async def go():
        async with h.client() as client:
            return await client.post(
                "/v1/chat/completions", content=raw, headers={**AUTH, "content-type": "application/json"}
            )

    response = asyncio.run(go())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert h.transport.opened == []


@pytest.mark.parametrize("raw", [b"[]", b"null", b"5", b"\xef\xbb\xbf{}", b'{"model": ', b"\xff\xfe{\x00}\x00", b""])
def test_a_body_that_is_no_json_object_is_invalid_json(raw: bytes) -> None:
    h = harness(simple_script("x"))

    async def go():
        async with h.client() as client:
            return await client.post("/v1/responses", content=raw, headers={**AUTH, "content-type": "application/json"})

    response = asyncio.run(go())
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json", response.text


def test_an_integral_number_is_an_integer_as_json_schema_reads_it() -> None:
    parsed = parse_body(b'{"n": 1.0, "max_tokens": 2e3, "temperature": 0.5}')
    assert parsed == {"n": 1, "max_tokens": 2000, "temperature": 0.5} and type(parsed["n"]) is int


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("PUT", "/v1/streams/abc", "DELETE, GET, HEAD"),  # two routes at one path: both named
        ("PATCH", "/v1/chat/completions", "POST"),
        ("POST", "/v1/models", "GET, HEAD"),
    ],
)
def test_a_405_names_every_method_published_at_the_path(method: str, path: str, allow: str) -> None:
    h = harness(simple_script("x"))

    async def go():
        async with h.client() as client:
            return await client.request(
                method, path, content=b"{}", headers={**AUTH, "content-type": "application/json"}
            )

    response = asyncio.run(go())
    assert response.status_code == 405 and response.headers["allow"] == allow
