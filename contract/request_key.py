"""The request key: the secret that identifies a request for `stop`.

A Triton request id is chosen by the client, logged and guessable, so it is
never a credential. The key is: the caller picks it (≥ 128 random bits) before
sending, so it can stop a request that is still queued or that answers only
once (`stream: false`); when absent, `preprocessing` / `llm_bls` mint one. Every
response carries it back, and the LLM step accepts `stop` only with it.
"""

from __future__ import annotations

import re
import secrets

from .errors import InvalidInputError, format_refusal

# 32 URL-safe characters carry 192 bits (token_urlsafe), 32 hex digits 128:
# both pass; anything shorter cannot hold 128 random bits.
MIN_LENGTH = 32
MAX_LENGTH = 128
_FORMAT = re.compile(rf"[A-Za-z0-9_-]{{{MIN_LENGTH},{MAX_LENGTH}}}")

# the LLM step's refusals of a `stop` (both variants answer them alike)
STOP_NEEDS_KEY = format_refusal(
    "request_key", "required to stop a request (a stop by request id alone is not accepted)"
)
STOP_UNKNOWN_KEY = format_refusal("stop", "no live request has this request_key (unknown request or already finished)")


def mint_request_key() -> str:
    return secrets.token_urlsafe(24)


def parse_request_key(value: str | None) -> str | None:
    """The caller's key, checked for its format; None when not given."""
    if value is None or value == "":
        return None
    if not _FORMAT.fullmatch(value):
        raise InvalidInputError(
            "request_key",
            f"must be {MIN_LENGTH} to {MAX_LENGTH} characters from [A-Za-z0-9_-] "
            f"(at least 128 random bits, e.g. secrets.token_urlsafe(24)); got {len(value)} characters",
        )
    return value


def adopt_or_mint(value: str | None) -> str:
    return parse_request_key(value) or mint_request_key()
