from __future__ import annotations

import pytest

from contract.errors import InvalidInputError, decode_utf8_field


def test_message_is_field_colon_problem() -> None:
    error = InvalidInputError("max_tokens", "must be positive")
    assert str(error) == "max_tokens: must be positive"
    assert error.field == "max_tokens" and isinstance(error, ValueError)


def test_decode_utf8_field() -> None:
    assert decode_utf8_field("text_input", "你好".encode()) == "你好"
    assert decode_utf8_field("text_input", "already text") == "already text"
    with pytest.raises(InvalidInputError, match=r"^text_input: not valid UTF-8 \(byte 1"):
        decode_utf8_field("text_input", b"a\xff\xfe")
