"""The one validator of the public inputs of `ensemble` / `llm_bls`, shared by
the three wire formats the gateway speaks for Triton (generate JSON, KServe v2
JSON infer, KServe v2 protobuf).

Source of truth: `contract/public_tensors.PUBLIC_INPUTS` (names, TYPE_*
datatypes, dims). A wire format only decodes its body into `WireInput`s (name,
datatype, shape, values decoded lazily); this module decides, in a fixed
order per input (known name, once, datatype, shape, values), then builds the
client library's `GenerationOptions` under the caller's tier. Every refusal is
a 400 `<input>: <what is wrong>` naming the input, before anything reaches
Triton, so that Triton's own fragile front (its JSON parser, shape checks)
never meets untrusted input.

What the gateway decides, whatever the caller sent: the engine `priority`
(the tier's), `max_tokens` (capped by the tier), the Triton request id
(minted per request: callers must not be able to collide with each other's
ids; the caller's `id` is only echoed), and output ids always asked for (the
completion tokens are charged to the caller's budget from them; outputs.py
hides them again when the caller did not ask)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from client import GenerationOptions
from contract.public_tensors import PUBLIC_INPUTS, TensorSpec

from ..bodies.guard import json_depth
from ..bodies.strict_json import is_utf8, shown
from ..config import TierConfig
from ..core.engine_request import capped_max_tokens
from ..core.errors import GatewayError

# Triton's TYPE_* names → the KServe datatype on the wire (TYPE_STRING is BYTES)
WIRE_DATATYPES = {
    "TYPE_STRING": "BYTES",
    "TYPE_BOOL": "BOOL",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_UINT64": "UINT64",
    "TYPE_FP32": "FP32",
}
SPECS: dict[str, TensorSpec] = {spec.name: spec for spec in PUBLIC_INPUTS}
KNOWN_INPUTS = ", ".join(SPECS)
_INT_RANGES = {"INT32": (-(2**31), 2**31 - 1), "UINT64": (0, 2**64 - 1)}
FP32_MAX = 3.4028234663852886e38
# `messages` is a JSON string; chat messages nest 4 deep at most (content parts),
# and a deeper document must not reach the recursive JSON parser
MAX_MESSAGES_DEPTH = 16
_LEADING_NAME = re.compile(r"([a-z_]+)(\[\d+\])?:?\s*")
_JSON_TYPES = {
    str: "a string",
    bytes: "bytes",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "a list",
    dict: "an object",
    type(None): "null",
}

Values = Callable[[], Sequence[Any]]


@dataclass(frozen=True)
class WireInput:
    """One input as a wire format carried it. `values` decodes the flat,
    row-major values; it is called only once the name, datatype and shape are
    known to be right, and raises ValueError("<what is wrong>") on bad data."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: Values


@dataclass(frozen=True)
class ValidatedCall:
    """A request ready to go upstream through the client library."""

    model: str
    text_input: str
    options: GenerationOptions
    streaming: bool  # the caller's `stream`: deltas, or one whole answer
    caller_id: str | None  # echoed as the response's `id`, never sent to Triton
    return_output_ids: bool  # what the caller asked; upstream always gets True

    @property
    def prompt_bytes(self) -> int:
        """The text the request brings, for the admission's token estimate."""
        messages = self.options.messages or []
        return len(self.text_input.encode()) + sum(len(str(m.get("content", "")).encode()) for m in messages)


def input_error(name: str, what: str) -> GatewayError:
    return GatewayError(400, f"{name}: {what}", param=name)


def wire_datatype(spec: TensorSpec) -> str:
    return WIRE_DATATYPES[spec.data_type]


def validate(
    model: str,
    inputs: Sequence[WireInput],
    *,
    tier: TierConfig,
    request_id: str,
    caller_id: str | None = None,
    stream_refusal: str | None = None,
) -> ValidatedCall:
    """The request as the gateway will send it; a GatewayError(400) naming the
    input otherwise. `stream_refusal`: on a route that answers once, why
    `stream: true` is refused (None: streaming allowed)."""
    values = checked_values(inputs)
    streaming = bool(values.pop("stream", False))
    if streaming and stream_refusal is not None:
        raise input_error("stream", stream_refusal)
    text_input = values.pop("text_input", None)
    if text_input is None:
        raise input_error("text_input", "required")
    messages = _messages(values.pop("messages", None))
    if not text_input and not messages:
        raise input_error("text_input", "must not be empty unless messages are given")
    values.pop("priority", None)  # the tier decides
    wants_ids = bool(values.pop("return_output_ids", False))
    request_key = values.pop("request_key", None) or None  # "": not given, the client library mints one
    for name in ("stop_words", "bad_words"):
        if name in values and not values[name]:
            values[name] = None  # an empty list: no words
    values["max_tokens"] = capped_max_tokens(values.get("max_tokens"), tier)
    values.setdefault("return_num_input_tokens", None)  # not sent unless the caller sent them
    values.setdefault("return_num_output_tokens", None)
    try:
        options = GenerationOptions(
            **values,
            messages=messages,
            priority=tier.priority,
            return_output_ids=True,
            request_key=request_key,
            request_id=request_id,
        )
    except ValueError as exc:
        raise _options_error(exc) from None
    return ValidatedCall(
        model=model,
        text_input=text_input,
        options=options,
        streaming=streaming,
        caller_id=caller_id,
        return_output_ids=wants_ids,
    )


def checked_values(inputs: Sequence[WireInput]) -> dict[str, Any]:
    """name → a scalar, or a list of strings for the word lists; each input
    checked in order: known, given once, datatype, shape, values."""
    out: dict[str, Any] = {}
    for item in inputs:
        spec = SPECS.get(item.name)
        if spec is None:
            raise input_error(shown(item.name), f"unknown input; the inputs are {KNOWN_INPUTS}")
        if item.name in out:
            raise input_error(item.name, "given more than once")
        expected = wire_datatype(spec)
        if item.datatype != expected:
            raise input_error(item.name, f"datatype {shown(item.datatype)} is not {expected}")
        count = _checked_shape(spec, item.shape)
        try:
            raw = list(item.values())
        except ValueError as exc:
            raise input_error(item.name, str(exc)) from None
        if len(raw) != count:
            raise input_error(item.name, f"shape {list(item.shape)} holds {count} value(s), got {len(raw)}")
        try:
            converted = [_value(expected, value) for value in raw]
        except ValueError as exc:
            raise input_error(item.name, str(exc)) from None
        out[item.name] = converted if spec.dims == (-1,) else converted[0]
    return out


def _checked_shape(spec: TensorSpec, shape: tuple[int, ...]) -> int:
    """The number of values the shape holds; scalars are [1] or [1, 1], word
    lists [n] or [1, n] (the public models batch, but the gateway sends one
    request per call)."""
    if any(d < 0 for d in shape):
        raise input_error(spec.name, f"shape {list(shape)} has a negative dimension")
    if len(shape) == 2 and shape[0] != 1:
        raise input_error(spec.name, f"batch size must be 1 (shape {list(shape)})")
    if spec.dims == (-1,):
        if len(shape) not in (1, 2):
            raise input_error(spec.name, f"shape {list(shape)} is not [n] or [1, n]")
        return shape[-1]
    if shape not in ((1,), (1, 1)):
        raise input_error(spec.name, f"shape {list(shape)} is not [1] or [1, 1] (one value)")
    return 1


def _value(datatype: str, value: Any) -> Any:
    """A wire value as the Python value GenerationOptions takes; ValueError("<what>") if it is none."""
    kind = type(value)
    if datatype == "BYTES":
        if isinstance(value, (bytes, bytearray)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
        if isinstance(value, str):
            if not is_utf8(value):
                raise ValueError("not valid UTF-8 (a lone surrogate)")
            return value
        raise ValueError(f"expected a string (BYTES), got {_JSON_TYPES.get(kind, kind.__name__)}")
    if datatype == "BOOL":
        if not isinstance(value, bool):
            raise ValueError(f"expected a boolean (BOOL), got {_JSON_TYPES.get(kind, kind.__name__)}")
        return value
    if datatype in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer ({datatype}), got {_JSON_TYPES.get(kind, kind.__name__)}")
        low, high = _INT_RANGES[datatype]
        if not low <= value <= high:
            raise ValueError(f"{value} is out of the {datatype} range")
        return value
    if datatype == "FP32":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number (FP32), got {_JSON_TYPES.get(kind, kind.__name__)}")
        number = float(value)
        if not math.isfinite(number) or abs(number) > FP32_MAX:
            raise ValueError(f"{value!r} is not a finite FP32 number")
        return number
    raise ValueError(f"datatype {datatype} is not supported")  # pragma: no cover (specs use the types above)


def _messages(value: str | None) -> list[dict[str, str]] | None:
    """`messages` is a JSON-encoded string (interface.md); "" means none."""
    if not value:
        return None
    if json_depth(value.encode(), MAX_MESSAGES_DEPTH) > MAX_MESSAGES_DEPTH:
        raise input_error("messages", f"JSON nested deeper than {MAX_MESSAGES_DEPTH} levels")
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise input_error("messages", f"not valid JSON ({exc})") from None
    if not isinstance(parsed, list):
        raise input_error("messages", 'must be a JSON array of {"role", "content"} objects')
    return parsed


def _options_error(exc: ValueError) -> GatewayError:
    """GenerationOptions' refusal ("top_p must be in (0, 1] (got 2.0)",
    "request_key: must be ...") as `<input>: <what>`; its messages never
    quote a request key."""
    message = str(exc)
    match = _LEADING_NAME.match(message)
    name = match.group(1) if match else ""
    if name not in SPECS:
        return GatewayError(400, message)
    rest = message[match.end() :] if match and not match.group(2) else message
    return input_error(name, rest)


def caller_id(value: Any) -> str | None:
    """The caller's request `id`, echoed in the response ("" is none)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise input_error("id", f"must be a string, got {_JSON_TYPES.get(type(value), type(value).__name__)}")
    return value
