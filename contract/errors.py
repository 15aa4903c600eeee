"""The error forms of the wire (docs/interface.md, "Errors"): what the text
stages and the LLM step write into a refusal, and how a reader (the gateway,
the client library, load tests) tells them apart.

- A refusal of client input starts with the public input field it is about:
  ``<field>: <what is wrong>``; the LLM step, refusing one of its own inputs that
  a public one feeds under another name, writes ``<public name> (<its name>): <what>``.
  `format_refusal` writes both, `parse_refusal` finds one (Triton may prefix the
  message, e.g. ``in ensemble 'ensemble', ``).
- A full engine queue: the message starts with `OVERLOADED_MARKER`; retryable.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass

OVERLOADED_MARKER = "overloaded:"

# a field name after the start or a separator Triton's prefixes end with
_REFUSAL = re.compile(r"(?:^|[\s,'(\[])([a-z_]+)(?: \(([a-z_]+)\))?: ")


def format_refusal(field: str, problem: str, internal: str | None = None) -> str:
    """The refusal of `field`: ``<field>: <problem>``, or with the name the
    refusing step knows the input by, ``<field> (<internal>): <problem>``."""
    if not field:
        raise ValueError("a refusal names the input field")
    return f"{field} ({internal}): {problem}" if internal else f"{field}: {problem}"


@dataclass(frozen=True)
class Refusal:
    field: str  # the name the refusal starts with
    internal: str | None  # the refusing step's own name for it, if written
    text: str  # the message from the field on (any prefix cut off)


def parse_refusal(message: str, fields: Container[str]) -> Refusal | None:
    """The first refusal in `message` of one of `fields`; None when it names none."""
    for match in _REFUSAL.finditer(message):
        if match.group(1) in fields:
            return Refusal(match.group(1), match.group(2), message[match.start(1) :])
    return None


class InvalidInputError(ValueError):
    """Bad client input; ``str(error)`` is ``"<field>: <what is wrong>"``. Its
    message is what the client sees (HTTP 400 body, gRPC error_message)."""

    def __init__(self, field: str, problem: str) -> None:
        if not field:
            raise ValueError("InvalidInputError needs the name of the input field")
        self.field = field
        self.problem = problem
        super().__init__(format_refusal(field, problem))


def decode_utf8_field(name: str, raw: bytes | bytearray | memoryview | str) -> str:
    """Decode a STRING tensor element; invalid UTF-8 is the client's error, not ours."""
    if isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(name, f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
