"""Strict JSON for request bodies: what RFC 8259 allows, and nothing Python's
`json` adds, every refusal located so that each door can name the field.

Python's `json` accepts what JSON does not, and each of those once reached a
handler as a value it could not render, check or send on:

- bytes that are not UTF-8 (`json.loads(bytes)` keeps encoded surrogates) and
  `\\ud800` escapes, which make lone surrogates: no UTF-8 answer can quote
  them back (a 500), no encoder (gRPC's included) can send them upstream;
- `NaN` / `Infinity` literals, and numbers too large for a float (`1e999`
  reads as infinity);
- integers of thousands of digits (Python refuses them deep in its parser,
  naming nothing);
- duplicate keys (silently the last one wins: the caller's intent is unknown).

Here the body is decoded as UTF-8 with each invalid byte kept as a lone
surrogate, parsed with hooks that put a marker where JSON allows no value, and
walked once: the first problem comes back as `Unfit(path, what)`. The OpenAI
routes (`gateway/openai/body.py`) and Triton's HTTP routes
(`gateway/triton/body_json.py`) each turn it into their own error, naming the
field as their callers know it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..core.errors import encodable

# longer integer literals are refused (the widest number either door takes is
# a UINT64 / OpenAI's seed: 20 digits), long before Python's own limit (4300)
MAX_INT_DIGITS = 40
# a caller's string quoted back in an error is cut to this many characters
SHOWN_CHARS = 64


class NotJSON(Exception):
    """The body is not JSON at all; `detail` says where the parser stopped."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unfit(Exception):
    """The body is JSON, but the value (or key) at `path` is one JSON cannot
    carry. `document` is the parsed body, for a door that names the field by
    what surrounds it."""

    def __init__(self, document: Any, path: list[str | int], what: str) -> None:
        super().__init__(f"{path_text(path)}: {what}")
        self.document = document
        self.path = path
        self.what = what


@dataclass(frozen=True)
class _Refused:
    """A value JSON does not allow, kept in place until the walk can say
    where it is (the parser's hooks do not know)."""

    what: str


def parse(raw: bytes, *, integral_as_int: bool = False) -> Any:
    """The document `raw` holds, or NotJSON / Unfit.

    `integral_as_int`: a number with an integral value (`1.0`, `2e3`) is read
    as an int, as JSON Schema reads it (JSON has one number type); off, it
    stays a float, as Triton reads it."""
    # surrogateescape: an invalid byte becomes a lone surrogate, refused by the walk with its field
    text = raw.decode("utf-8", "surrogateescape")
    number = _integral_number if integral_as_int else _number
    try:
        document = json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int, parse_float=number
        )
    except json.JSONDecodeError as exc:
        raise NotJSON(f"{exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise NotJSON("nested too deeply") from None
    problem = _first_problem(document, [])
    if problem is not None:
        raise Unfit(document, *problem)
    return document


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if not is_utf8(key):
            out[key] = _Refused("the field name is not valid UTF-8")
        elif key in out:
            # every later copy too: the first one's value must not be taken for the caller's
            out[key] = _Refused("given more than once in one JSON object")
        else:
            out[key] = value
    return out


def _constant(literal: str) -> _Refused:
    return _Refused(f"{literal} is not a JSON number (only finite numbers are)")


def _int(literal: str) -> int | _Refused:
    digits = literal.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        return _Refused(f"an integer of {len(digits)} digits is out of range")
    return int(literal)


def _number(literal: str) -> float | _Refused:
    value = float(literal)
    if value in (float("inf"), float("-inf")):  # a literal is never NaN: that is _constant's
        return _Refused(f"{shown(literal)} is out of range (only finite numbers are accepted)")
    return value


def _integral_number(literal: str) -> float | int | _Refused:
    value = _number(literal)
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**64:
        exact = Decimal(literal)  # the float may have rounded a fraction away
        if exact == exact.to_integral_value():
            return int(exact)
    return value


def _first_problem(value: Any, path: list[str | int]) -> tuple[list[str | int], str] | None:
    """(where, what) of the first value JSON does not allow, depth first."""
    if isinstance(value, _Refused):
        return path, value.what
    if isinstance(value, str):
        return None if is_utf8(value) else (path, "not valid UTF-8 (an invalid byte or a lone surrogate)")
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_problem(item, [*path, key])
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_problem(item, [*path, index])
            if found is not None:
                return found
    return None


def path_text(path: Sequence[str | int]) -> str:
    """`a.b[0].c`, each key shown (bounded, encodable)."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{shown(part)}" if text else shown(part))
    return text


def is_utf8(text: str) -> bool:
    """Whether `text` has no lone surrogate (all else encodes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(text: str) -> str:
    """A caller's string as an error quotes it: bounded, and encodable (an
    invalid byte as `\\udcXX`)."""
    return encodable(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")
