"""The JSON of a Triton HTTP body, parsed strictly, every refusal a 400 naming
the field where there is one.

Python's `json` accepts what JSON (RFC 8259) does not, and each of those once
reached a handler as a value it could not render or check: bytes that are not
UTF-8 (`json.loads(bytes)` keeps encoded surrogates, and a `\\ud800` escape makes
a lone surrogate, which no UTF-8 answer can quote back: a 500), `NaN` /
`Infinity` literals and `1e999` (non-finite floats), integers of thousands of
digits (Python refuses them deep in the parser, naming nothing), and duplicate
keys (silently the last one wins). Here the body is decoded as UTF-8 with each
invalid byte kept as a marker, parsed with hooks that mark what JSON does not
allow, and then walked once: the first problem is refused naming the field
(for an infer body, the input whose tensor holds it)."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GatewayError

# longer integer literals are refused (the widest public input is UINT64: 20 digits)
MAX_INT_DIGITS = 40
_SHOWN = 64


@dataclass(frozen=True)
class _Refused:
    """A value JSON does not allow, kept in place so the walk can name its field."""
    what: str


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def parse(raw: bytes) -> Any:
    """The document, or a GatewayError(400) naming the field that is wrong."""
    # surrogateescape: an invalid byte becomes a lone surrogate, refused by the walk with its field
    text = raw.decode("utf-8", "surrogateescape")
    try:
        document = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_int)
    except _Duplicate as duplicate:
        name = _shown(duplicate.key)
        raise GatewayError(400, f"{name}: given more than once in one JSON object", param=name) from None
    except (ValueError, RecursionError) as exc:
        raise GatewayError(400, f"The body is not valid JSON: {_shown(str(exc))}") from None
    problem = _first_problem(document, [])
    if problem is not None:
        path, what = problem
        name = _field(document, path)
        where = _path_text(path)
        at = f" (at {where})" if where != name else ""
        raise GatewayError(400, f"{name}: {what}{at}", param=name)
    return document


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if not _is_utf8(key):
            out[key] = _Refused("the field name is not valid UTF-8")
        elif key in out:
            raise _Duplicate(key)
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


def _first_problem(value: Any, path: list[str | int]) -> tuple[list[str | int], str] | None:
    """(where, what) of the first value JSON does not allow, depth first."""
    if isinstance(value, _Refused):
        return path, value.what
    if isinstance(value, str):
        return None if _is_utf8(value) else (path, "not valid UTF-8 (an invalid byte or a lone surrogate)")
    if isinstance(value, float) and not math.isfinite(value):
        return path, f"{value} is out of range (only finite numbers are accepted)"
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


def _field(document: Any, path: Sequence[str | int]) -> str:
    """The field a caller knows: the top-level key, or in an infer body the
    tensor's input (or output) name when it has a clean one."""
    if not path:
        return "body"
    if len(path) >= 3 and path[0] in ("inputs", "outputs") and isinstance(path[1], int) and path[2] != "name":
        tensor = document[path[0]][path[1]]
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if isinstance(name, str) and _is_utf8(name):
            return _shown(name)
    return _shown(_path_text(path[:1])) if len(path) == 1 or path[0] not in ("inputs", "outputs") \
        else _path_text(path[:3])


def _path_text(path: Sequence[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{_shown(part)}" if text else _shown(part))
    return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """A caller's string, bounded and encodable (invalid bytes as `\\udcXX`)."""
    text = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
