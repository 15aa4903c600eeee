"""The value rules of the public inputs that depend on the value alone
(docs/interface.md), defined once. The engine checks them at intake
(`SamplingParams.validate`, `request_inputs.py`), the client library before
sending (`GenerationOptions`), and the gateway before anything reaches Triton
(`gateway/triton/inputs.py`), so a caller gets the same `<field>: <what>` from
each. Rules that depend on the served model or its configuration (the vocabulary,
`max_model_len`, `max_tokens_limit`, the KV cache) stay with the engine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidInputError


@dataclass(frozen=True)
class Bound:
    """An interval (`low` / `high`, each inclusive unless `*_open`; None: no
    bound), or `only`: the one value accepted, with `why` the reason."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    only: float | None = None
    why: str = ""
    integer: bool = False

    def problem(self, value: object) -> str | None:
        """What is wrong with `value`, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be a number, got {value!r}"
        if self.integer and not isinstance(value, int):
            return f"must be an integer, got {value!r}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if self.only is not None:
            return None if value == self.only else f"{value} {self.why}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {self.describe()}, got {value}"
        if self.high is not None and value > self.high:
            return f"must be {self.describe()}, got {value}"
        return None

    def describe(self) -> str:
        low = None if self.low is None else _shown(self.low)
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.low is None:
            return f"<= {_shown(self.high)}"
        return f"in {'(' if self.low_open else '['}{low}, {_shown(self.high)}]"


def _shown(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(low=1, integer=True),
    "min_tokens": Bound(low=0, integer=True),
    "top_k": Bound(low=0, integer=True),
    "top_p": Bound(low=0, low_open=True, high=1),
    "temperature": Bound(low=0),  # 0 = greedy
    "repetition_penalty": Bound(low=0, low_open=True),  # divides positive logits
    "presence_penalty": Bound(),  # any finite number (OpenAI's semantics)
    "frequency_penalty": Bound(),
    # TensorRT-LLM's length penalty only rescores beams; this stack samples one
    # sequence per request, so anything but the neutral value would be ignored
    "length_penalty": Bound(
        only=1.0, why="applies to beam search only, which this engine does not do; send 1.0 or leave it out"
    ),
    "token_timeout_ms": Bound(low=0, integer=True),  # 0 = off
    "seed": Bound(low=0, high=2**64 - 1, integer=True),
}


# stop_words / bad_words: at most this many words, each non-empty and at most this long
MAX_WORDS = 64
MAX_WORD_CHARS = 256


def bound_problem(name: str, value: object) -> str | None:
    """What is wrong with `value` for the input `name` (None: nothing, or no rule)."""
    bound = BOUNDS.get(name)
    return None if bound is None or value is None else bound.problem(value)


def check_bound(name: str, value: object) -> None:
    """Raise InvalidInputError("<name>: <what>") if `value` breaks the input's rule."""
    problem = bound_problem(name, value)
    if problem is not None:
        raise InvalidInputError(name, problem)


def validate_words(field: str, words: Sequence[str] | None) -> list[str]:
    """The request's word list, checked: strings, non-empty, bounded."""
    if words is None:
        return []
    if isinstance(words, str):
        raise InvalidInputError(field, "must be a list of strings, not one string")
    words = list(words)
    if len(words) > MAX_WORDS:
        raise InvalidInputError(field, f"{len(words)} words; at most {MAX_WORDS}")
    for index, word in enumerate(words):
        if not isinstance(word, str):
            raise InvalidInputError(field, f"item {index} is not a string")
        if not word:
            raise InvalidInputError(field, f"item {index} is empty")
        if len(word) > MAX_WORD_CHARS:
            raise InvalidInputError(field, f"item {index} is longer than {MAX_WORD_CHARS} characters")
    return words
