"""The one error type the text stages raise for bad client input.

Its message is what the client sees (HTTP 400 body, gRPC error_message), so it
always starts with the public input field it is about: ``<field>: <what is wrong>``.
"""
from __future__ import annotations


class InvalidInputError(ValueError):
    """Bad client input; ``str(error)`` is ``"<field>: <what is wrong>"``."""

    def __init__(self, field: str, problem: str) -> None:
        if not field:
            raise ValueError("InvalidInputError needs the name of the input field")
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def decode_utf8_field(name: str, raw: bytes | bytearray | memoryview | str) -> str:
    """Decode a STRING tensor element; invalid UTF-8 is the client's error, not ours."""
    if isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(name, f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
