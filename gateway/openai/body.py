"""The OpenAI routes' JSON bodies, parsed here rather than by Starlette's
`json.loads(bytes)`, so that whatever a body holds is a 400 naming the field:

- invalid UTF-8 (in a key or a value; RFC 8259 JSON is UTF-8) and lone
  surrogates (`"\\ud800"`, which no encoder, gRPC's included, can send on);
- `NaN` / `Infinity` (Python's json takes them, JSON has no such literal) and
  numbers too large for a float (`1e400` would read as infinity);
- integers too long for Python to read (over `sys.get_int_max_str_digits()`).

And a number with an integral value is an integer (`1.0` for `n`), as JSON
Schema reads it; the models' types are strict otherwise (no `"1"` for 1).

Starlette answered the first with FastAPI's unnamed "error parsing the body"
and the others reached validation, or upstream, as values. The parsed body is
handed to FastAPI (Starlette's `Request._json` cache), which validates it
against the route's pydantic model as before."""
from __future__ import annotations

import json
import math
from decimal import Decimal
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from ..errors import GatewayError


class _Unreadable:
    """A number the body holds that is no value: kept as this marker until the
    walk below can say which field it is in."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _constant(name: str) -> _Unreadable:
    return _Unreadable(f"must be a finite number ({name} is not JSON)")


def _integer(text: str) -> int | _Unreadable:
    try:
        return int(text)
    except ValueError:          # more digits than Python converts
        return _Unreadable(f"an integer of {len(text)} digits is out of range")


def _number(text: str) -> float | int:
    """JSON has one number type, and JSON Schema calls an integral one (`1.0`,
    `2e3`) an integer: read so, a published `integer` takes it."""
    value = float(text)
    if value.is_integer() and abs(value) <= 2 ** 64:
        exact = Decimal(text)
        if exact == exact.to_integral_value():
            return int(exact)
    return value


def _shown(text: str) -> str:
    """A key as it can be printed and sent back (JSON escapes for what is not UTF-8)."""
    return json.dumps(text)[1:-1] if not _encodable(text) else text


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _problem(value: Any, path: str) -> tuple[str, str] | None:
    """The first field (OpenAI's `a.b[0].c`) whose key or value is not a JSON
    value, and what is wrong with it."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{_shown(key)}" if path else _shown(key)
            if not _encodable(key):
                return where, "the key is not valid UTF-8"
            found = _problem(item, where)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _problem(item, f"{path}[{index}]")
            if found is not None:
                return found
    elif isinstance(value, str):
        if not _encodable(value):
            return path, "not valid UTF-8 (an invalid byte sequence or a lone surrogate)"
    elif isinstance(value, _Unreadable):
        return path, value.problem
    elif isinstance(value, float) and not math.isfinite(value):
        return path, "must be a finite number (out of a double's range)"
    return None


def parse_body(body: bytes) -> Any:
    """The JSON value of `body`, or a 400: `invalid_json` (not JSON at all) or
    `invalid_value` naming the field that holds what JSON cannot carry."""
    # invalid bytes become lone surrogates (U+DC80..U+DCFF), found by the walk with their field
    text = body.decode("utf-8", "surrogateescape")
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_integer, parse_float=_number)
    except json.JSONDecodeError as exc:
        raise GatewayError(400, f"The body must be a JSON object (OpenAI request format): {exc.msg} "
                                f"at position {exc.pos}.", code="invalid_json") from None
    except (ValueError, RecursionError):
        raise GatewayError(400, "The body must be a JSON object (OpenAI request format).",
                           code="invalid_json") from None
    if not isinstance(value, dict):
        raise GatewayError(400, "The body must be a JSON object (OpenAI request format).", code="invalid_json")
    found = _problem(value, "")
    if found is not None:
        param, problem = found
        raise GatewayError(400, f"{param}: {problem}", param=param, code="invalid_value")
    return value


class OpenAIRoute(APIRoute):
    """A route whose JSON body is read by `parse_body` before FastAPI validates it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler          # no body to read: whatever was sent is ignored, as before

        async def parsed_first(request: Request) -> Response:
            body = await request.body()
            if body:
                # Starlette's cache of the parsed body: FastAPI's request.json() answers it
                request._json = parse_body(body)
            return await handler(request)

        return parsed_first
