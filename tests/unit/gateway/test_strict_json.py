"""The strict JSON both doors parse bodies with (gateway/bodies/strict_json.py): what
RFC 8259 allows and nothing Python's json adds, the first problem located by
its path. How each door names the field: test_openai_body.py and
test_triton_body_json.py."""

from __future__ import annotations

import pytest

from gateway.bodies import strict_json
from gateway.core.errors import GatewayError


def unfit(raw: bytes) -> strict_json.Unfit:
    with pytest.raises(strict_json.Unfit) as caught:
        strict_json.parse(raw)
    return caught.value


@pytest.mark.parametrize(
    "raw, path, what",
    [
        (b'{"te\xffxt": 1}', ["te\udcffxt"], "the field name is not valid UTF-8"),
        (b'{"a": {"\\udfff": "v"}}', ["a", "\udfff"], "the field name is not valid UTF-8"),
        (b'{"\xed\xa0\x80": 1}', ["\udced\udca0\udc80"], "the field name is not valid UTF-8"),
        (b'{"text": "a\xffb"}', ["text"], "not valid UTF-8 (an invalid byte or a lone surrogate)"),
        (b'{"text": "a\\ud800b"}', ["text"], "not valid UTF-8 (an invalid byte or a lone surrogate)"),
        (b'{"words": ["ok", "\xc3"]}', ["words", 1], "not valid UTF-8"),
        (b'{"t": NaN}', ["t"], "NaN is not a JSON number (only finite numbers are)"),
        (b'{"t": -Infinity}', ["t"], "-Infinity is not a JSON number"),
        (b'{"t": [1, {"u": 1e999}]}', ["t", 1, "u"], "1e999 is out of range (only finite numbers are accepted)"),
        (b'{"t": -1e400}', ["t"], "-1e400 is out of range"),
        (b'{"seed": ' + b"9" * 5000 + b"}", ["seed"], "an integer of 5000 digits is out of range"),
        (b'{"seed": -' + b"1" * 41 + b"}", ["seed"], "an integer of 41 digits is out of range"),
        (b'{"a": 1, "b": {"c": 1, "c": 2}}', ["b", "c"], "given more than once in one JSON object"),
        (b'{"a": 1, "a": 2, "a": 3}', ["a"], "given more than once"),
        (b'"\xff"', [], "not valid UTF-8"),
    ],
)
def test_the_first_value_json_cannot_carry_is_located(raw: bytes, path: list[str | int], what: str) -> None:
    refused = unfit(raw)
    assert refused.path == path and refused.what.startswith(what), (refused.path, refused.what)


def test_the_first_problem_in_document_order_is_the_one_refused() -> None:
    assert unfit(b'{"a": [1, "ok", NaN], "b": "\xff"}').path == ["a", 2]


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,]", b"\xff\xfe", b'{"a": }', b"\xef\xbb\xbf{}", b"[" * 100_000])
def test_what_is_not_json_says_where_the_parser_stopped(raw: bytes) -> None:
    with pytest.raises(strict_json.NotJSON) as caught:
        strict_json.parse(raw)
    assert caught.value.detail


def test_good_json_parses_as_json() -> None:
    raw = b'{"a": [1, 2.5, 2.0, "\xc3\xa9", true, null], "b": {"c": -3, "d": "' + b"9" * 40 + b'"}}'
    assert strict_json.parse(raw) == {"a": [1, 2.5, 2.0, "é", True, None], "b": {"c": -3, "d": "9" * 40}}
    assert isinstance(strict_json.parse(b"[2.0]")[0], float)
    assert strict_json.parse(b"[" + b"9" * 40 + b"]") == [int("9" * 40)]


@pytest.mark.parametrize(
    "literal, value",
    [
        ("1.0", 1),
        ("2e3", 2000),
        ("-0.0", 0),
        ("1.5", 1.5),
        ("18446744073709551616.0", 2**64),
        ("1e30", 1e30),
        ("1.0000000000000000001", 1.0000000000000000001),
    ],
)
def test_integral_as_int_reads_an_integral_number_as_an_integer(literal: str, value: float | int) -> None:
    parsed = strict_json.parse(f"[{literal}]".encode(), integral_as_int=True)[0]
    assert parsed == value and type(parsed) is type(value), parsed


def test_path_text_names_keys_and_indexes_shown() -> None:
    assert strict_json.path_text(["a", "b", 0, "c"]) == "a.b[0].c"
    assert strict_json.path_text(["\udcff", 1]) == "\\udcff[1]"
    assert strict_json.path_text(["x" * 70]) == "x" * 64 + "..."


def test_shown_is_bounded_and_encodable() -> None:
    assert strict_json.shown("abc") == "abc"
    assert strict_json.shown("é\udcff") == "é\\udcff"
    assert strict_json.shown("y" * 65) == "y" * 64 + "..."


def test_a_gateway_error_quoting_a_lone_surrogate_still_encodes() -> None:
    error = GatewayError(400, "\ud800: unknown input", param="\ud800")
    assert error.message == "\\ud800: unknown input" and error.param == "\\ud800"
