"""`max_tokens` is validated once, where it enters the text stages, against
the engine's own default and limit (rendered into the stages' configs)."""

from __future__ import annotations

import pytest

from contract.errors import InvalidInputError
from ensemble.inbound.llm_request import EngineMaxTokens, _checked_max_tokens

LIMITS = EngineMaxTokens(default_max_tokens=77, max_tokens_limit=100)


def test_absent_max_tokens_takes_the_engines_default():
    assert _checked_max_tokens(None, LIMITS) == 77


@pytest.mark.parametrize(
    "value,expected",
    [
        (0, r"^max_tokens: must be a positive integer, got 0$"),
        (-3, r"^max_tokens: must be a positive integer, got -3$"),
        (True, r"^max_tokens: must be a positive integer, got True$"),
        (2.5, r"^max_tokens: must be a positive integer, got 2.5$"),
        (101, r"^max_tokens: must be <= 100, got 101$"),
    ],
)
def test_a_bad_max_tokens_is_named(value, expected):
    with pytest.raises(InvalidInputError, match=expected):
        _checked_max_tokens(value, LIMITS)


def test_the_limit_itself_is_allowed():
    assert _checked_max_tokens(100, LIMITS) == 100


def test_limits_have_no_defaults_of_their_own():
    with pytest.raises(
        TypeError,
        match=r"missing 2 required positional arguments: 'default_max_tokens' and "
        r"'max_tokens_limit'$",
    ):
        EngineMaxTokens()  # type: ignore[call-arg]
