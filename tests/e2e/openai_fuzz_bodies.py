"""Raw request bodies for the OpenAI routes' fuzz (test_gateway_openai_fuzz.py),
drawn from a seeded `random.Random`: a valid body, or one with exactly one
thing broken, named in `Body.field` (the top-level field the refusal must
name; None for a body that is not JSON at all).

Bodies are bytes: a value or key to be written raw is a placeholder string in
the dict, replaced after `json.dumps`, so that invalid UTF-8, lone surrogate
escapes, `NaN` and numbers no parser can hold reach the gateway as sent."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

INT32 = 2**31 - 1
FP32_MAX = 3.4028234663852886e38
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
MODELS = ("ensemble", "llm_bls")


@dataclass(frozen=True)
class Raw:
    """JSON text written as is in place of a value or a key."""

    text: bytes


BAD_STRINGS = [
    Raw(b'"\xff"'),
    Raw(b'"ab\xc3\x28cd"'),
    Raw(b'"\xed\xa0\x80"'),
    Raw(b'"x\xf8\x88\x80\x80\x80"'),
    Raw(b'"tail\xe2\x82"'),
    Raw(b'"\\ud800"'),
    Raw(b'"a\\udfffb"'),
    Raw(b'"\x80\x81\x82"'),
]
NON_FINITE = [Raw(b"NaN"), Raw(b"Infinity"), Raw(b"-Infinity"), Raw(b"1e400"), Raw(b"-1e400"), Raw(b"9" * 5000)]
WRONG_TYPES: list[Any] = ["5", "true", True, [], {}, [1], {"a": 1}, "", None]


@dataclass(frozen=True)
class Int:
    low: int
    high: int
    valid: tuple[int, int] | None = None  # the range drawn for valid bodies, when narrower

    def good(self, rng: random.Random) -> Any:
        low, high = self.valid or (self.low, self.high)
        return rng.choice([low, high, rng.randint(low, high)])

    def bad(self, rng: random.Random) -> Any:
        return rng.choice(
            [
                self.low - 1,
                self.high + 1,
                self.high + rng.randint(2, 10**30),
                self.low - 10**20,
                self.low + 0.5,
                str(self.low),
                True,
                False,
                [self.low],
                {"v": self.low},
                "",
                rng.choice(NON_FINITE),
            ]
        )


@dataclass(frozen=True)
class Float:
    low: float
    high: float
    valid: tuple[float, float] | None = None

    def good(self, rng: random.Random) -> Any:
        low, high = self.valid or (self.low, self.high)
        return rng.uniform(low, high)

    def bad(self, rng: random.Random) -> Any:
        above = self.high * 2 if self.high > 1e30 else self.high + 0.001 + rng.random() * 1e6
        return rng.choice(
            [self.low - 0.001 - rng.random(), above, str(self.high), True, [0.5], {"v": 1}, "", rng.choice(NON_FINITE)]
        )


@dataclass(frozen=True)
class OneOf:
    """Values accepted, and values refused (besides the wrong types)."""

    good_values: tuple[Any, ...]
    bad_values: tuple[Any, ...] = ()
    free_text: bool = False  # any string is accepted: no string is a wrong type

    def good(self, rng: random.Random) -> Any:
        return rng.choice(self.good_values)

    def bad(self, rng: random.Random) -> Any:
        wrong = [
            v
            for v in WRONG_TYPES
            if v not in self.good_values
            and not (v is None and None in self.good_values)
            and not (self.free_text and isinstance(v, str))
        ]
        return rng.choice(list(self.bad_values) * 3 + wrong + BAD_STRINGS)


BOOL = OneOf((True, False, None), (0, 1, "true", "yes"))
TEXT = OneOf(("u1", "Ünïcødé ✓", "", None), (5, 1.5), free_text=True)
ID_512 = OneOf(("u1", "x" * 512, "", None), ("x" * 513, 7), free_text=True)
NEUTRAL_LIST = ([], None)
MESSAGE_BAD = (
    [],
    "hi",
    [1],
    [{"role": "tool", "content": "x", "tool_call_id": "1"}],
    [{"role": "function", "content": "x", "name": "f"}],
    [{"role": "robot", "content": "x"}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
    [{"role": "user", "content": 5}],
    [{"role": "user", "content": "x", "extra": 1}],
    [{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}],
    [{"content": "x"}],
    [{"role": "user", "content": BAD_STRINGS[0]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "assistant", "content": "x", "audio": {"id": "a"}}],
)

SAMPLING: dict[str, Any] = {
    "model": OneOf(MODELS, ("gpt-4o", "", "ensemble ", "x" * 300, 5)),
    "max_tokens": Int(1, INT32),
    "n": Int(1, 4),
    "seed": Int(0, 2**64 - 1),
    "temperature": Float(0, 2),
    "top_p": Float(1e-6, 1),
    "presence_penalty": Float(-2, 2),
    "frequency_penalty": Float(-2, 2),
    "repetition_penalty": Float(1e-6, FP32_MAX, valid=(0.8, 1.3)),
    "top_k": Int(0, INT32, valid=(0, 50)),
    "min_tokens": Int(0, INT32, valid=(0, 2)),
    "token_timeout_ms": Int(1, 60_000, valid=(30_000, 60_000)),  # a short one would expire: a 504 of its own
    "stream": BOOL,
    "ignore_eos": BOOL,
    "user": ID_512,
    "stop": OneOf(
        ("END", ["a", "b"], [], None), ("", [""], [str(i) for i in range(17)], [1], 5, {"a": "b"}), free_text=True
    ),
    "logit_bias": OneOf(({}, None), ({"50256": -100}, {"1": 1.0}, [1])),
    "stream_options": OneOf((None,), ({"include_usage": True}, {"include_usage": "yes"}, {"x": 1}, 5)),
}
CHAT: dict[str, Any] = {
    **SAMPLING,
    "messages": OneOf(([{"role": "user", "content": "Hi"}],), MESSAGE_BAD),
    "max_completion_tokens": Int(1, INT32),
    "logprobs": BOOL,
    "top_logprobs": Int(0, 0),
    "metadata": OneOf(({"a": "b"}, {}, None), ({"a": 5}, "x", [1], {"k": BAD_STRINGS[2]})),
    "store": BOOL,
    "parallel_tool_calls": BOOL,
    "service_tier": TEXT,
    "safety_identifier": ID_512,
    "prompt_cache_key": TEXT,
    "tools": OneOf(NEUTRAL_LIST, ([{"type": "function", "function": {"name": "f"}}], "x")),
    "functions": OneOf(NEUTRAL_LIST, ([{"name": "f"}],)),
    "tool_choice": OneOf(("none", None), ("auto", "required", {"type": "function", "function": {"name": "f"}})),
    "function_call": OneOf(("none", None), ("auto", {"name": "f"})),
    "response_format": OneOf(
        ({"type": "text"}, None), ({"type": "json_object"}, {"type": "json_schema"}, "text", {"type": "text", "x": 1})
    ),
    "modalities": OneOf((["text"], None), (["text", "audio"], ["audio"], [], "text")),
    **{
        name: OneOf((None,), ("x", {"voice": "alloy"}, "high", 0, False))
        for name in ("audio", "prediction", "reasoning_effort", "verbosity", "web_search_options", "moderation")
    },
}
COMPLETIONS: dict[str, Any] = {
    **SAMPLING,
    "prompt": OneOf(("Hello", ["Hello"]), ("", [], [""], [1, 2, 3], [[1, 2]], 5, None), free_text=True),
    "logprobs": Int(0, 0),
    "echo": OneOf((False, None), (True, 0)),
    "suffix": OneOf(("", None), ("x", 5)),
    "best_of": OneOf((None, 1), (0, 2, 3, -1, "1")),
}
RESPONSES: dict[str, Any] = {
    "model": SAMPLING["model"],
    "max_output_tokens": Int(1, INT32),
    "temperature": Float(0, 2),
    "top_p": Float(1e-6, 1),
    "stream": BOOL,
    "store": BOOL,
    "user": ID_512,
    "safety_identifier": ID_512,
    "token_timeout_ms": SAMPLING["token_timeout_ms"],
    "instructions": TEXT,
    "prompt_cache_key": TEXT,
    "input": OneOf(
        (
            "Hi",
            [{"role": "user", "content": "Hi"}],
            [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        ),
        (
            [],
            5,
            [{"role": "tool", "content": "x"}],
            [{"role": "user"}],
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            [{"role": "user", "content": "x", "x": 1}],
            [{"role": "user", "content": BAD_STRINGS[5]}],
        ),
        free_text=True,
    ),
    "metadata": CHAT["metadata"],
    "parallel_tool_calls": BOOL,
    "service_tier": TEXT,
    "truncation": OneOf(("disabled", None), ("auto",)),
    "text": OneOf(({"format": {"type": "text"}}, {}, None), ({"format": {"type": "json_object"}}, {"x": 1}, "x")),
    "tools": OneOf(NEUTRAL_LIST, ([{"type": "web_search"}],)),
    "include": OneOf(NEUTRAL_LIST, (["x"],)),
    "tool_choice": OneOf(("none", None), ("auto",)),
    "reasoning": OneOf((None,), ({"effort": "high"},)),
    "previous_response_id": OneOf((None,), ("resp_1",)),
    "conversation": OneOf((None,), ("c_1",)),
    "top_logprobs": Int(0, 0),
    "stream_options": SAMPLING["stream_options"],
    "background": OneOf((False, True, None), ("yes",)),
}
SPECS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS, "/v1/responses": RESPONSES}
REQUIRED = {
    "/v1/chat/completions": ("model", "messages"),
    "/v1/completions": ("model", "prompt"),
    "/v1/responses": ("model", "input"),
}
NOT_JSON = [
    b"",
    b"{",
    b"[]",
    b"5",
    b'"x"',
    b"null",
    b"\xef\xbb\xbf{}",
    b'{"model": }',
    b"\xff\xfe{\x00}\x00",
    b"{'model': 'ensemble'}",
    b'{"a": NaN',
    b"\x00\x01\x02",
]
NAMES = ["frobnicate", "Model", "messages ", "température", "名前", "x" * 300, "tools\u0000", "$ref", "__proto__"]


@dataclass(frozen=True)
class Body:
    raw: bytes
    kind: str
    field: str | None  # the top-level field the refusal must name; None: not JSON at all
    has_bad_bytes: bool = False
    has_non_finite: bool = False


def _encode(value: dict[str, Any]) -> bytes:
    """JSON bytes with each Raw written as is (keys included)."""
    raws: dict[str, bytes] = {}

    def placeholders(item: Any) -> Any:
        if isinstance(item, Raw):
            token = f"@@RAW{len(raws)}@@"
            raws[token] = item.text
            return token
        if isinstance(item, dict):
            return {placeholders(k) if isinstance(k, Raw) else k: placeholders(v) for k, v in item.items()}
        if isinstance(item, list):
            return [placeholders(v) for v in item]
        return item

    text = json.dumps(placeholders(value), ensure_ascii=False).encode("utf-8")
    for token, raw in raws.items():
        text = text.replace(f'"{token}"'.encode(), raw)
    return text


def _valid(rng: random.Random, route: str) -> dict[str, Any]:
    spec = SPECS[route]
    body = {name: spec[name].good(rng) for name in REQUIRED[route]}
    for name in rng.sample(sorted(spec), rng.randint(0, 4)):
        if name not in ("stream_options", "n") or route == "/v1/chat/completions" and name == "n":
            body[name] = spec[name].good(rng)
    return body


def _shown_key(raw: bytes) -> str:
    """A raw key as the gateway names it (gateway.bodies.strict_json.shown): decoded, each bad byte or lone
    surrogate as `\\udcXX` / `\\ud800`."""
    key = json.loads((b'"' + raw + b'"').decode("utf-8", "surrogateescape"))
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def draw_body(rng: random.Random, route: str) -> Body:
    roll = rng.random()
    body = _valid(rng, route)
    if roll < 0.08:
        return Body(_encode(body), "valid", None)
    if roll < 0.11:
        return Body(rng.choice(NOT_JSON), "not_json", None)
    if roll < 0.17:
        name = rng.choice(NAMES)
        body[name] = rng.choice([1, "x", None, {"a": [1]}])
        return Body(_encode(body), "unknown_field", name)
    if roll < 0.23:
        raw = rng.choice(BAD_STRINGS).text[1:-1]
        body[Raw(b'"' + raw + b'"')] = rng.choice([1, "x"])
        return Body(_encode(body), "bad_key", _shown_key(raw), has_bad_bytes=True)
    if roll < 0.25 and route == "/v1/completions":
        body.update(prompt=["a", "b", "c"], n=2)  # n × prompts over gateway.limits.max_n (4)
        return Body(_encode(body), "cross_field", "n")
    if roll < 0.27:
        extra = {"/v1/responses": {"stream": False, "background": True, "store": False}}.get(
            route, {"stream": False, "stream_options": {"include_usage": True}}
        )
        body.update(extra)
        return Body(_encode(body), "cross_field", "background" if "background" in extra else "stream_options")
    name = rng.choice(sorted(SPECS[route]))
    value = SPECS[route][name].bad(rng)
    body[name] = value
    if name == "stream_options":
        body["stream"] = False  # with a stream, {} and a few others are fine
    text = _encode(body)
    bad_bytes = any(raw.text in text for raw in BAD_STRINGS)
    non_finite = isinstance(value, Raw) and value in NON_FINITE
    kind = "bad_bytes" if bad_bytes else "non_finite" if non_finite else "bad_value"
    return Body(text, kind, name, has_bad_bytes=bad_bytes, has_non_finite=non_finite)
