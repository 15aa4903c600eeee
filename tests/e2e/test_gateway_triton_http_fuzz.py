"""A bounded fuzz of the gateway's Triton-style HTTP routes (`generate`,
`generate_stream`, KServe v2 `infer`, for `ensemble` and `llm_bls`) against
the real stack, with a valid key: 2,400 bodies from a seeded generator, each
with one thing wrong or nothing wrong: invalid UTF-8 (raw bytes and escaped
lone surrogates, in keys and in values), NaN / Infinity literals and 1e999,
integers of thousands of digits, duplicate keys, out-of-range values for every
bounded input (contract/public_bounds.py and the datatypes' ranges), wrong
JSON types for every input, unknown fields and inputs, wrong datatypes and
shapes, values only the engine can judge (a chat role, a too long
continuation), and some good bodies that generate (the tier caps max_tokens).

Asserted: no response >= 500, no connection reset or protocol error, every
refusal caused by a field is a 400 in Triton's shape `{"error": "<field>:
..."}` naming it, and the good bodies are answered 200. The status counts and
the time are printed."""

from __future__ import annotations

import collections
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from contract.public_bounds import BOUNDS, MAX_WORD_CHARS, MAX_WORDS
from contract.public_tensors import PUBLIC_INPUTS
from gateway.triton.inputs import wire_datatype
from serving.launcher import TritonServer
from tests.e2e.fuzz_gateway import FuzzGateway, fuzz_gateway_process

pytestmark = pytest.mark.e2e

SEED = 20261202
BODIES = 2400
TOKENS_CAP = 4  # the fuzz tier's max_tokens_cap: a good body generates at most 4 tokens
MODELS = ("ensemble", "llm_bls")
ROUTES = ("generate", "generate_stream", "infer")
KNOWN = {spec.name: wire_datatype(spec) for spec in PUBLIC_INPUTS}
WORD_LISTS = {spec.name for spec in PUBLIC_INPUTS if spec.dims == (-1,)}
_RANGES = {"INT32": (-(2**31), 2**31 - 1), "UINT64": (0, 2**64 - 1)}
# one value of each JSON type, and which datatypes take it
_TYPED = {
    "string": ("x", {"BYTES"}),
    "integer": (3, {"INT32", "UINT64", "FP32"}),
    "number": (0.5, {"FP32"}),
    "boolean": (True, {"BOOL"}),
    "null": (None, set()),
    "object": ({"a": 1}, set()),
    "nested": ([[1]], set()),
}
# what no Triton body may hold, as raw JSON text
_NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e999", "-1e999")
_NOT_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80abc", b"\xe2\x82")


@dataclass(frozen=True)
class Case:
    route: str
    model: str
    body: bytes
    kind: str
    culprit: str | None  # the field the refusal must name; None: no field (or none expected)
    good: bool = False  # must be answered 200


def _scalar(name: str, value: object, route: str) -> dict[str, object]:
    """`name` = `value` as the route carries an input (raw JSON text allowed through `_raw`)."""
    if route != "infer":
        return {name: value}
    return {"name": name, "datatype": KNOWN.get(name, "BYTES"), "shape": [1], "data": [value]}


class _Raw(str):
    """JSON text to splice in as is (NaN, invalid bytes...)."""


def _encode(route: str, fields: list[tuple[str | bytes, object]]) -> bytes:
    """A body of `fields` (in order, duplicates kept); a key given as bytes and
    a `_Raw` value are spliced in unencoded."""

    def text(value: object) -> bytes:
        if isinstance(value, _Raw):
            return value.encode("utf-8", "surrogateescape")
        if isinstance(value, bytes):
            return b'"' + value + b'"'
        if isinstance(value, list):
            return b"[" + b", ".join(text(item) for item in value) + b"]"
        return json.dumps(value).encode()

    if route == "infer":
        tensors = []
        for name, value in fields:
            key = name if isinstance(name, bytes) else json.dumps(name).encode()[1:-1]
            datatype = KNOWN.get(name, "BYTES") if isinstance(name, str) else "BYTES"
            tensors.append(
                b'{"name": "' + key + b'", "datatype": "' + datatype.encode() + b'", "shape": [1], '
                b'"data": [' + text(value) + b"]}"
            )
        return b'{"inputs": [' + b", ".join(tensors) + b"]}"
    parts = []
    for name, value in fields:
        key = name if isinstance(name, bytes) else json.dumps(name).encode()[1:-1]
        parts.append(b'"' + key + b'": ' + text(value))
    return b"{" + b", ".join(parts) + b"}"


def _out_of_range(rng: random.Random, name: str) -> object:
    bound = BOUNDS.get(name)
    datatype = KNOWN[name]
    choices: list[object] = []
    if datatype in _RANGES:
        low, high = _RANGES[datatype]
        choices += [low - 1, high + 1, high * 1000]
    if datatype == "FP32":
        choices += [3.5e38, -1e39]
    if bound is not None:
        if bound.only is not None:
            choices += [bound.only + 0.5, 0.0, -1.0]
        if bound.low is not None:
            choices += [bound.low if bound.low_open else bound.low - 1, bound.low - 1000]
        if bound.high is not None and (datatype != "UINT64"):
            choices += [bound.high + 1 if bound.integer else bound.high + 0.25]
    return rng.choice(choices)


def _wrong_type(rng: random.Random, name: str) -> object:
    datatype = KNOWN[name]
    return rng.choice([value for value, takes in _TYPED.values() if datatype not in takes])


BOUNDED = sorted(name for name in KNOWN if name in BOUNDS or KNOWN[name] in _RANGES or KNOWN[name] == "FP32")
NOT_SENT = {"priority", "request_key"}  # the tier decides; a key is a secret the fuzz need not guess


def _good(rng: random.Random) -> list[tuple[str, object]]:
    fields: list[tuple[str, object]] = [
        ("text_input", rng.choice(["Say hello", "1, 2, 3,", "The sky is"])),
        ("max_tokens", rng.randint(1, 50)),
    ]
    for name, value in (
        ("temperature", rng.choice([0.0, 0.7])),
        ("top_p", rng.choice([0.5, 1.0])),
        ("top_k", rng.randint(0, 40)),
        ("seed", rng.randint(0, 2**64 - 1)),
        ("stop_words", ["\n\n"]),
        ("repetition_penalty", 1.1),
        ("length_penalty", 1.0),
        ("min_tokens", 1),
        ("return_num_input_tokens", True),
    ):
        if rng.random() < 0.3:
            fields.append((name, value))
    return fields


def generate_case(rng: random.Random) -> Case:
    route, model = rng.choice(ROUTES), rng.choice(MODELS)
    base: list[tuple[str | bytes, object]] = [("text_input", "Hi"), ("max_tokens", 2)]
    kind = rng.choices(
        [
            "range",
            "type",
            "unknown",
            "utf8_value",
            "utf8_key",
            "surrogate",
            "non_finite",
            "huge_int",
            "duplicate",
            "words",
            "engine",
            "not_object",
            "good",
        ],
        weights=[20, 16, 8, 8, 6, 5, 8, 4, 5, 5, 1.2, 4, 1.2],
    )[0]
    culprit: str | None
    if kind == "range":
        culprit = rng.choice([n for n in BOUNDED if n not in NOT_SENT])
        value: object = _out_of_range(rng, culprit)
    elif kind == "type":
        culprit = rng.choice([n for n in KNOWN if n not in NOT_SENT])
        value = _wrong_type(rng, culprit)
        if route == "infer" and isinstance(value, list):
            value = {"a": 1}  # infer data may nest: an object stays wrong
    elif kind == "unknown":
        culprit = rng.choice(["foo", "max_token", "Temperature", "top-p", "ünïcode", "n", "logprobs", "x" * 70])
        value = rng.choice([1, "x", True, None, [1]])
        culprit = culprit if len(culprit) <= 64 else culprit[:64] + "..."
    elif kind == "utf8_value":
        culprit = rng.choice(["text_input", "messages", "segment", "stop_words"])
        raw = rng.choice(_NOT_UTF8)
        value = [b"ok", raw] if culprit == "stop_words" and route != "infer" else b"a" + raw + b"z"
    elif kind == "utf8_key":
        key = rng.choice([b"te\xffxt", b"\xed\xa0\x80", b"max\xc3tokens", b"\x80"])
        fields = [*base, (key, 1)]
        rng.shuffle(fields)
        # named as the caller wrote it, each invalid byte shown as \udcXX; in an
        # infer body the name is a tensor's, named by its place
        named = (
            f"inputs[{fields.index((key, 1))}].name"
            if route == "infer"
            else key.decode("utf-8", "surrogateescape").encode("utf-8", "backslashreplace").decode()
        )
        return Case(route, model, _encode(route, fields), kind, named)
    elif kind == "surrogate":
        culprit = rng.choice(["text_input", "segment", "id" if route != "infer" else "text_input"])
        value = _Raw('"a\\ud800b"')
    elif kind == "non_finite":
        culprit = rng.choice([n for n in KNOWN if n not in NOT_SENT])
        value = _Raw(rng.choice(_NON_FINITE))
    elif kind == "huge_int":
        culprit = rng.choice([n for n in KNOWN if n not in NOT_SENT])
        value = _Raw(rng.choice(["9" * 5000, "-" + "1" * 400, "1" * 41]))
    elif kind == "duplicate":
        culprit = rng.choice(["text_input", "max_tokens"])
        fields = [*base, (culprit, rng.choice(["again", 3]))]
        return Case(route, model, _encode(route, fields), kind, culprit)
    elif kind == "words":
        culprit = rng.choice(sorted(WORD_LISTS - {"continuation_ids"}))
        value = rng.choice([["w"] * (MAX_WORDS + 1), ["x" * (MAX_WORD_CHARS + 1)], ["a", ""]])
        if route == "infer":
            body = {
                "inputs": [
                    _scalar("text_input", "Hi", route),
                    {"name": culprit, "datatype": "BYTES", "shape": [len(value)], "data": value},
                ]
            }
            return Case(route, model, json.dumps(body).encode(), kind, culprit)
    elif kind == "engine":
        # values only the text stages can judge: refused upstream, a 400 naming the field
        culprit, value = rng.choice(
            [
                ("messages", json.dumps([{"role": "wizard", "content": "hi"}])),
                ("continuation_ids", [1, 2, 3, 4, 5, 6]),
            ]
        )
        fields = (
            [("text_input", ""), ("max_tokens", 2), (culprit, value)]
            if culprit == "messages"
            else [*base, (culprit, value)]
        )
        if route == "infer" and culprit == "continuation_ids":
            body = {
                "inputs": [
                    _scalar("text_input", "Hi", route),
                    _scalar("max_tokens", 2, route),
                    {"name": culprit, "datatype": "INT32", "shape": [len(value)], "data": value},
                ]
            }
            return Case(route, model, json.dumps(body).encode(), kind, culprit)
        return Case(route, model, _encode(route, fields), kind, culprit)
    elif kind == "not_object":
        body = rng.choice(
            [
                b"",
                b"[]",
                b"null",
                b"42",
                b'"text"',
                b"{",
                b'{"text_input": }',
                b"\xff\xfe",
                b'{"inputs": {}}',
                b"[" * 20 + b"]" * 20,
            ]
        )
        return Case(route, model, body, kind, None)
    else:
        fields = list(_good(rng))
        return Case(route, model, _encode(route, fields), kind, None, good=True)
    fields = [(k, v) for k, v in base if k != culprit] + [(culprit, value)]
    rng.shuffle(fields)
    return Case(route, model, _encode(route, fields), kind, culprit)


@pytest.fixture(scope="module")
def fuzz_gateway(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzGateway]:
    with fuzz_gateway_process(
        triton_server, tmp_path_factory.mktemp("gateway-triton-http-fuzz"), tokens_cap=TOKENS_CAP, label="triton-fuzz"
    ) as gateway:
        yield gateway


def _error_text(response: httpx.Response) -> str:
    """The message of a Triton-shaped error: a JSON body, or generate_stream's one `data:` event."""
    text = response.text
    if text.startswith("data: "):
        text = text[len("data: ") :].strip()
    try:
        body = json.loads(text)
    except ValueError:
        return f"<not JSON: {text[:200]!r}>"
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, str) else f"<not Triton's error shape: {text[:200]!r}>"


def test_triton_http_routes_answer_every_generated_body_without_5xx(fuzz_gateway: FuzzGateway) -> None:
    rng = random.Random(SEED)
    cases = [generate_case(rng) for _ in range(BODIES)]
    statuses: collections.Counter[int] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    broken: list[str] = []
    headers = {"Authorization": f"Bearer {fuzz_gateway.key}", "Content-Type": "application/json"}
    started = time.monotonic()
    with httpx.Client(base_url=fuzz_gateway.url, timeout=120) as client:
        for index, case in enumerate(cases):
            path = f"/v2/models/{case.model}/{case.route}"
            try:
                response = client.post(path, content=case.body, headers=headers)
            except httpx.HTTPError as exc:  # a reset, a protocol error, a timeout
                broken.append(f"#{index} {case.kind} {path}: {exc!r} body={case.body[:120]!r}")
                continue
            statuses[response.status_code] += 1
            kinds[case.kind] += 1
            where = f"#{index} {case.kind} {path} body={case.body[:160]!r}"
            if response.status_code >= 500:
                failures.append(f"{where}: {response.status_code} {response.text[:200]!r}")
            elif case.good:
                if response.status_code != 200:
                    failures.append(f"{where}: a good body got {response.status_code} {response.text[:200]!r}")
            elif response.status_code == 200 and case.route != "generate_stream":
                failures.append(f"{where}: accepted")
            elif response.status_code >= 400 and case.culprit is not None:
                message = _error_text(response)
                if response.status_code != 400 or not message.startswith(f"{case.culprit}:"):
                    failures.append(f"{where}: {response.status_code} does not name {case.culprit!r}: {message!r}")
            elif response.status_code == 200:  # generate_stream: the refusal must come before the 200
                failures.append(f"{where}: a refusal after the 200: {response.text[:200]!r}")
    took = time.monotonic() - started
    print(
        f"\n[Triton HTTP fuzz: {len(cases)} bodies in {took:.1f} s; statuses {dict(sorted(statuses.items()))}; "
        f"kinds {dict(sorted(kinds.items()))}; {len(broken)} broken connections]"
    )
    assert not broken, broken[:10]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
    assert sum(statuses.values()) >= 2000
    assert statuses[200] > 0 and statuses[400] > 0
