"""The published OpenAPI document is the contract: generated from the request
models the validators are, with their bounds, enums, unions and
`additionalProperties: false`, and the deployment's `gateway.limits.max_n`. Checked
two ways: the schema's own words (bounds, enums), and its verdict on bodies
against the gateway's answer (schema-valid ⇔ 200)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gateway.app import create_app
from gateway.config import GatewayConfig, LimitsConfig
from gateway.core.upstream import PUBLIC_MODELS
from gateway.openai.fields import FP32_TINY, INT32_MAX
from gateway.openai.schemas import MAX_STOP_SEQUENCES
from tests.unit.gateway.openai_fakes import AUTH, FakePolicy, harness, simple_script

MAX_N = 3  # not the default (4): the published bound comes from the setting
REQUEST_MODELS = ("ChatCompletionRequest", "CompletionRequest", "ResponseRequest")


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(GatewayConfig(limits=LimitsConfig(max_n=MAX_N)), FakePolicy()).openapi()


def _prop(document: dict[str, Any], component: str, name: str) -> dict[str, Any]:
    return document["components"]["schemas"][component]["properties"][name]


def _members(prop: dict[str, Any]) -> list[dict[str, Any]]:
    return prop.get("anyOf", [prop])


def _member(prop: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(m for m in _members(prop) if m.get("type") == kind)


def test_every_object_in_a_request_refuses_unknown_fields(document: dict[str, Any]) -> None:
    objects = {
        name: schema
        for name, schema in document["components"]["schemas"].items()
        if schema.get("type") == "object" and name != "Error"
    }
    assert set(REQUEST_MODELS) | {"ChatMessage", "TextPart", "InputMessage", "TextContent"} <= set(objects)
    assert all(schema.get("additionalProperties") is False for schema in objects.values()), [
        name for name, schema in objects.items() if schema.get("additionalProperties") is not False
    ]


def test_the_validators_bounds_and_enums_are_published(document: dict[str, Any]) -> None:
    for component in ("ChatCompletionRequest", "CompletionRequest", "ResponseRequest"):
        assert _prop(document, component, "model")["enum"] == list(PUBLIC_MODELS)
        assert {
            k: v for k, v in _member(_prop(document, component, "temperature"), "number").items() if k != "type"
        } == {"minimum": 0, "maximum": 2}
        # > 0 as the engine's FP32 input holds it: its smallest normal
        assert _member(_prop(document, component, "top_p"), "number") == {
            "type": "number",
            "minimum": FP32_TINY,
            "maximum": 1,
        }
    tokens = _member(_prop(document, "ChatCompletionRequest", "max_tokens"), "integer")
    assert (tokens["minimum"], tokens["maximum"]) == (1, INT32_MAX)
    assert _member(_prop(document, "ChatCompletionRequest", "n"), "integer")["maximum"] == MAX_N
    stop = _members(_prop(document, "CompletionRequest", "stop"))
    assert {"type": "string", "minLength": 1} in stop
    assert _member(_prop(document, "CompletionRequest", "stop"), "array")["maxItems"] == MAX_STOP_SEQUENCES
    assert _member(_prop(document, "CompletionRequest", "prompt"), "array")["maxItems"] == MAX_N
    assert _member(_prop(document, "ChatCompletionRequest", "seed"), "integer")["maximum"] == 2**64 - 1
    assert _prop(document, "ChatMessage", "role")["enum"] == ["system", "developer", "user", "assistant"]
    # refused values are not in the accepted type
    assert _member(_prop(document, "ChatCompletionRequest", "tools"), "array")["maxItems"] == 0
    assert _member(_prop(document, "ChatCompletionRequest", "logit_bias"), "object")["maxProperties"] == 0
    assert _member(_prop(document, "ChatCompletionRequest", "top_logprobs"), "integer")["maximum"] == 0
    assert _prop(document, "ChatCompletionRequest", "reasoning_effort")["type"] == "null"
    assert {m.get("const") for m in _members(_prop(document, "ChatCompletionRequest", "tool_choice"))} == {"none", None}
    assert {m.get("const") for m in _members(_prop(document, "CompletionRequest", "echo"))} == {False, None}
    assert _prop(document, "ResponseRequest", "previous_response_id")["type"] == "null"


def test_errors_are_published_as_answered(document: dict[str, Any]) -> None:
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "422" not in chat and chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
    assert set(document["paths"]["/v1/streams/{stream_id}"]["get"]["responses"]["200"]["content"]) == {
        "text/event-stream"
    }
    model = document["paths"]["/v1/models/{model}"]["get"]["parameters"][0]["schema"]
    assert model["enum"] == list(PUBLIC_MODELS)


def _validator(document: dict[str, Any], component: str) -> Draft202012Validator:
    registry = Registry().with_resource(
        "urn:openapi", Resource.from_contents(document, default_specification=DRAFT202012)
    )
    return Draft202012Validator({"$ref": f"urn:openapi#/components/schemas/{component}"}, registry=registry)


CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}]}
PROMPT = {"model": "llm_bls", "prompt": "Hi"}
RESPONSE = {"model": "ensemble", "input": "Hi"}
# (route, body): each the schema and the gateway must agree on
BODIES: list[tuple[str, dict[str, Any]]] = [
    *[
        ("/v1/chat/completions", {**CHAT, **extra})
        for extra in [
            {},
            {"n": MAX_N},
            {"n": MAX_N + 1},
            {"tools": []},
            {"tools": [{"type": "function"}]},
            {"tool_choice": "none"},
            {"tool_choice": "auto"},
            {"response_format": {"type": "text"}},
            {"response_format": {"type": "json_object"}},
            {"logit_bias": {}},
            {"logit_bias": {"1": 2.0}},
            {"top_logprobs": 0, "logprobs": True},
            {"top_logprobs": 2},
            {"modalities": ["text"]},
            {"modalities": ["text", "audio"]},
            {"stop": ["a"] * 16},
            {"stop": ["a"] * 17},
            {"stop": ""},
            {"stream": True, "stream_options": {"include_usage": True}},
            {"stream_options": {"include_usage": True}},
            {"temperature": 2},
            {"temperature": 2.01},
            {"max_tokens": INT32_MAX},
            {"max_tokens": INT32_MAX + 1},
            {"max_tokens": "5"},
            {"stream": 1},
            {"top_p": 1e-40},
            {"top_p": FP32_TINY},
            {"token_timeout_ms": 999},
            {"token_timeout_ms": 1000},
            {"seed": 2**64 - 1},
            {"seed": 2**64},
            {"n": 2.0},
            {"max_tokens": 1.5},
            {"max_tokens": 1e3},
            {"temperature": True},
            {"model": "gpt-4o"},
            {"audio": None},
            {"audio": {"voice": "alloy"}},
            {"messages": [{"role": "tool", "content": "x"}]},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            {"messages": []},
            {"unknown": 1},
        ]
    ],
    *[
        ("/v1/completions", {**PROMPT, **extra})
        for extra in [
            {},
            {"prompt": ["a"] * MAX_N},
            {"prompt": ["a"] * (MAX_N + 1)},
            {"prompt": ["a", "b"], "n": 2},
            {"prompt": "a", "n": MAX_N},
            {"best_of": 1},
            {"n": 2, "best_of": 2},
            {"n": 2, "best_of": 3},
            {"best_of": 2},
            {"echo": False},
            {"echo": True},
            {"echo": 0},
            {"suffix": ""},
            {"suffix": "x"},
            {"logprobs": 0},
            {"logprobs": 1},
            {"prompt": ""},
            {"prompt": []},
            {"prompt": [1, 2]},
        ]
    ],
    *[
        ("/v1/responses", {**RESPONSE, **extra})
        for extra in [
            {},
            {"background": True},
            {"background": True, "store": False},
            {"store": False},
            {"stream": True, "stream_options": {"include_obfuscation": False}},
            {"stream_options": {}},
            {"text": {"format": {"type": "text"}}},
            {"text": {"format": {"type": "json_object"}}},
            {"tools": []},
            {"tools": [{"type": "web_search"}]},
            {"reasoning": {"effort": "low"}},
            {"top_logprobs": 0},
            {"top_logprobs": 1},
            {"input": []},
            {"max_output_tokens": 0},
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]},
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        ]
    ],
]
COMPONENTS = {
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/completions": "CompletionRequest",
    "/v1/responses": "ResponseRequest",
}


def test_the_schema_accepts_exactly_what_the_gateway_accepts(document: dict[str, Any]) -> None:
    h = harness(simple_script("x"), limits=LimitsConfig(max_n=MAX_N))

    async def answers() -> list[int]:
        async with h.client() as client:
            return [
                (
                    await client.post(
                        route, content=json.dumps(body), headers={**AUTH, "content-type": "application/json"}
                    )
                ).status_code
                for route, body in BODIES
            ]

    disagreements = []
    for (route, body), status in zip(BODIES, asyncio.run(answers())):
        valid = _validator(document, COMPONENTS[route]).is_valid(body)
        if valid != (status == 200) or status >= 500:
            disagreements.append(f"{route} {body}: schema {'valid' if valid else 'invalid'}, gateway {status}")
    assert not disagreements, "\n".join(disagreements)


def test_bodies_generated_from_the_published_schema_are_accepted(document: dict[str, Any]) -> None:
    """Schemathesis's own generator (positive mode, every property's bounds and
    enums) in-process, against the fake engine: the e2e run leaves the coverage
    phase's positive cases out (each would be a generation on the real engine)."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_dict(document)
    bodies: list[tuple[str, Any]] = []
    for route in COMPONENTS:
        generated: list[Any] = []

        @settings(
            max_examples=80, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
        )
        @given(schema[route]["POST"].as_strategy())
        def collect(case: Any) -> None:
            generated.append(case.body)  # noqa: B023

        collect()
        bodies += [(route, body) for body in generated]
    h = harness(simple_script("x"), limits=LimitsConfig(max_n=MAX_N))

    async def answers() -> list[tuple[int, str]]:
        async with h.client() as client:
            replies = [
                await client.post(route, content=json.dumps(body), headers={**AUTH, "content-type": "application/json"})
                for route, body in bodies
            ]
            return [(r.status_code, r.text[:200]) for r in replies]

    refused = [
        f"{route} {json.dumps(body)[:300]} → {status} {text}"
        for (route, body), (status, text) in zip(bodies, asyncio.run(answers()))
        if status != 200
    ]
    assert len(bodies) >= 3 * 50 and not refused, "\n".join(refused[:10])


def test_every_published_operation_needs_the_api_key_and_refuses_without_it(document: dict[str, Any]) -> None:
    # the document says so (generated clients send the key; a fuzzer checks it is enforced) ...
    scheme = document["components"]["securitySchemes"]["apiKey"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert document["security"] == [{"apiKey": []}]
    operations = [(method, path) for path, ops in document["paths"].items() for method in ops]
    assert len(operations) >= 9

    # ... and the gateway does: no key or a wrong one is a 401 on each, body or not
    bodies = {"/v1/chat/completions": CHAT, "/v1/completions": PROMPT, "/v1/responses": RESPONSE}

    async def statuses() -> list[tuple[str, str, str, int]]:
        h = harness(simple_script("x"))
        found = []
        async with h.client() as client:
            for method, path in operations:
                url = (
                    path.replace("{model}", "ensemble")
                    .replace("{response_id}", "resp_x")
                    .replace("{stream_id}", "chatcmpl-x")
                )
                for label, headers in (("no key", {}), ("wrong key", {"Authorization": "Bearer sk-wrong"})):
                    answer = await client.request(method.upper(), url, json=bodies.get(path), headers=headers)
                    found.append((method, path, label, answer.status_code))
        return found

    refused = asyncio.run(statuses())
    assert all(status == 401 for *_, status in refused), [r for r in refused if r[-1] != 401]
