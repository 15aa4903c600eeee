"""The published OpenAPI document (`/openapi.json`): FastAPI's, generated from
the request models the validators are (schemas.py, responses_schema.py), plus
what only this deployment knows or FastAPI cannot tell from the routes:

- `n` up to `gateway.limits.max_n`, and on completions n × number of prompts ≤ max_n
  with `best_of` equal to n: the same setting `translate.check_n` refuses
  with, said as an `anyOf` over the allowed `n` (JSON Schema has no product);
- the seed's exact bound (2**64 - 1: FastAPI's document model rounds it to a float);
- errors as they are answered: 400 (never FastAPI's 422) and every other
  status in OpenAI's error shape;
- a streamed answer (`stream: true`) as `text/event-stream`;
- the API key every published route needs (`Authorization: Bearer`), so that
  generated clients send it and a fuzzer can check that it is enforced."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .schemas import SEED_MAX

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
API_KEY_SCHEME = {
    "apiKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "an API key (`python -m gateway keys create --tier ...`)",
    }
}
# each event's data: a chunk (chat, completions), a typed event (Responses), an
# error, or OpenAI's closing `[DONE]`
_SSE = {"schema": {"description": "server-sent events: `data: {chunk}` ... `data: [DONE]`"}}
_STREAMED = {
    ("post", "/v1/chat/completions"),
    ("post", "/v1/completions"),
    ("post", "/v1/responses"),
    ("get", "/v1/responses/{response_id}"),
    ("get", "/v1/streams/{stream_id}"),
}
_ONLY_STREAMED = {("get", "/v1/streams/{stream_id}")}  # a resume is always SSE


def _integer_branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The integer member of a pydantic `int | None` property."""
    return next(s for s in prop["anyOf"] if s.get("type") == "integer")


def _choices(max_n: int) -> dict[str, Any]:
    """n × prompts ≤ max_n and best_of = n, for each n allowed."""

    def equal(k: int) -> dict[str, Any]:
        return {"anyOf": [{"const": k}, {"type": "null"}]}

    branches: list[dict[str, Any]] = [{"properties": {"n": equal(1), "best_of": equal(1)}}]
    for k in range(2, max_n + 1):
        branches.append(
            {
                "required": ["n"],
                "properties": {
                    "n": {"const": k},
                    "best_of": equal(k),
                    "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "maxItems": max_n // k}]},
                },
            }
        )
    return {"anyOf": branches}


def _bound_choices(components: dict[str, Any], max_n: int) -> None:
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        _integer_branch(components[name]["properties"]["n"])["maximum"] = max_n
        # FastAPI's OpenAPI model holds bounds as floats: 2**64 - 1 would be published as 2**64
        _integer_branch(components[name]["properties"]["seed"])["maximum"] = SEED_MAX
    completion = components["CompletionRequest"]
    _integer_branch(completion["properties"]["best_of"])["maximum"] = max_n
    listed = next(s for s in completion["properties"]["prompt"]["anyOf"] if s.get("type") == "array")
    listed["maxItems"] = max_n
    completion.setdefault("allOf", []).append(_choices(max_n))


def _responses_as_answered(paths: dict[str, Any]) -> None:
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation["responses"]
            responses.pop("422", None)  # validation errors are 400 here (gateway/app.py)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
            ok = responses.get("200")
            if ok is not None and (method, path) in _STREAMED:
                ok.setdefault("content", {})["text/event-stream"] = _SSE
            if ok is not None and (method, path) in _ONLY_STREAMED:
                ok["content"] = {"text/event-stream": _SSE}


def published_schema(app: FastAPI, max_n: int) -> dict[str, Any]:
    """What `GET /openapi.json` answers (built once, as FastAPI's own)."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            openapi_version=app.openapi_version,
            description=app.description,
            routes=app.routes,
        )
        components = schema["components"]["schemas"]
        _bound_choices(components, max_n)
        _responses_as_answered(schema["paths"])
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        components["Error"] = ERROR_SCHEMA
        schema["components"]["securitySchemes"] = API_KEY_SCHEME
        schema["security"] = [{name: []} for name in API_KEY_SCHEME]
        app.openapi_schema = schema
    return app.openapi_schema


def allowed_methods(app: FastAPI, path: str) -> str | None:
    """A 405's `Allow` for a published path: every method the document names
    there (Starlette names only its first route's, and GET and DELETE
    /v1/streams/{id} are two routes); None for a path it does not publish."""
    for template, operations in app.openapi()["paths"].items():
        if re.fullmatch(
            re.sub(r"\{[^/}]+\}", "[^/]+", re.escape(template).replace(r"\{", "{").replace(r"\}", "}")), path
        ):
            methods = {method.upper() for method in operations} | ({"HEAD"} if "get" in operations else set())
            return ", ".join(sorted(methods))
    return None
