"""The refusal form: what the text stages and the LLM step write
(`format_refusal`) is what the gateway reads back (`parse_refusal`)."""

from __future__ import annotations

import pytest

from contract.errors import Refusal, format_refusal, parse_refusal

FIELDS = {"max_tokens", "length_penalty", "len_penalty", "stop"}


def test_the_two_forms() -> None:
    assert format_refusal("max_tokens", "must be >= 1, got 0") == "max_tokens: must be >= 1, got 0"
    assert (
        format_refusal("length_penalty", "must be 1.0", internal="len_penalty")
        == "length_penalty (len_penalty): must be 1.0"
    )
    with pytest.raises(ValueError):
        format_refusal("", "no field")


@pytest.mark.parametrize("internal", [None, "len_penalty"])
def test_what_is_written_is_read_back(internal: str | None) -> None:
    written = format_refusal("length_penalty", "applies to beam search only", internal)
    assert parse_refusal(written, FIELDS) == Refusal("length_penalty", internal, written)


def test_a_prefix_is_cut_off_and_unknown_fields_are_passed_over() -> None:
    # Triton prefixes the message through the ensemble; "ensemble" is no input
    message = "in ensemble 'ensemble', max_tokens: must be >= 1, got 0"
    assert parse_refusal(message, FIELDS) == Refusal("max_tokens", None, "max_tokens: must be >= 1, got 0")
    assert parse_refusal("tensorrt_llm: boom", FIELDS) is None
    assert parse_refusal("overloaded: waiting queue is full", FIELDS) is None
