"""The OpenAI routes' JSON bodies, parsed strictly (gateway/bodies/strict_json.py)
rather than by Starlette's `json.loads(bytes)`, so that whatever a body holds
that JSON cannot carry (invalid UTF-8, lone surrogates, `NaN`, `1e400`, a
5,000-digit integer, a duplicate key) is a 400 naming the field in OpenAI's
`param` (`a.b[0].c`). Starlette answered the first with FastAPI's unnamed
"error parsing the body" and the others reached validation, or upstream, as
values.

A number with an integral value is an integer (`1.0` for `n`), as JSON Schema
reads it; the models' types are strict otherwise (no `"1"` for 1). The parsed
body is handed to FastAPI (Starlette's `Request._json` cache), which validates
it against the route's pydantic model as before."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from ..bodies import strict_json
from ..core.errors import GatewayError

_NOT_AN_OBJECT = "The body must be a JSON object (OpenAI request format)"


def parse_body(body: bytes) -> Any:
    """The JSON value of `body`, or a 400: `invalid_json` (not a JSON object)
    or `invalid_value` naming the field that holds what JSON cannot carry."""
    try:
        value = strict_json.parse(body, integral_as_int=True)
    except strict_json.NotJSON as exc:
        raise GatewayError(400, f"{_NOT_AN_OBJECT}: {exc.detail}.", code="invalid_json") from None
    except strict_json.Unfit as exc:
        if not isinstance(exc.document, dict):  # the refusal a body that is no object gets first
            raise GatewayError(400, f"{_NOT_AN_OBJECT}.", code="invalid_json") from None
        param = strict_json.path_text(exc.path)
        raise GatewayError(400, f"{param}: {exc.what}", param=param, code="invalid_value") from None
    if not isinstance(value, dict):
        raise GatewayError(400, f"{_NOT_AN_OBJECT}.", code="invalid_json")
    return value


class OpenAIRoute(APIRoute):
    """A route whose JSON body is read by `parse_body` before FastAPI validates it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler  # no body to read: whatever was sent is ignored, as before

        async def parsed_first(request: Request) -> Response:
            body = await request.body()
            if body:
                # Starlette's cache of the parsed body: FastAPI's request.json() answers it
                request._json = parse_body(body)
            return await handler(request)

        return parsed_first
