"""A caller's request as the engine requests it becomes, whatever the door:
each engine request's text and options (the client library's
`GenerationOptions`), the tier's cap on `max_tokens`, and the lower bound of
the prompt's tokens the admission is charged before the engine counts them."""

from __future__ import annotations

from dataclasses import dataclass

from client import GenerationOptions

from ..config import TierConfig

# the admission is charged this lower bound of the prompt's tokens before the
# engine has counted them (no BPE vocabulary averages more than 8 bytes a
# token); the real count is added when the first response brings it
BYTES_PER_TOKEN_BOUND = 8


@dataclass(frozen=True)
class UpstreamRequest:
    """One engine request: one choice of the answer."""

    index: int
    text_input: str
    options: GenerationOptions
    prompt_index: int = 0  # the n choices of one prompt share its prompt tokens in `usage`


def capped_max_tokens(requested: int | None, tier: TierConfig) -> int | None:
    """The tier's values win over the caller's: `max_tokens` is capped by
    `tier.max_tokens_cap`. None leaves the engine's default (itself bounded by its limit)."""
    cap = tier.max_tokens_cap
    if cap <= 0:
        return requested
    return cap if requested is None else min(requested, cap)
