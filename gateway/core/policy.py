"""The seam between the request handlers and access control: who the caller
is (API key → tier), whether the tier may use a model, and admission under the
per-key QPS / tokens-per-second / concurrency limits and the global cap.

The doors (gateway/openai/, triton/, streams/) call only this interface;
gateway/admission/ (keys, tiers, limits) implements it (`AccessPolicy`).
Every GatewayError raised here carries its status and headers (401, 403, 429
with Retry-After and x-ratelimit-*)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..config import TierConfig


@dataclass(frozen=True)
class Caller:
    key_id: str  # never the key itself
    tier_name: str
    tier: TierConfig
    # a streamed answer is sent in one piece: one content event with the whole
    # text (the degradation controller's level 3, gateway/degrade/)
    one_piece: bool = False


class Admission(Protocol):
    """One admitted request's hold on its caller's budget."""

    headers: dict[str, str]  # x-ratelimit-* for the response

    async def add_tokens(self, count: int) -> None:
        """Tokens as they really flow (output tokens as they stream): never
        refused; past the limit they become the key's debt."""

    async def release(self) -> None:
        """Idempotent; frees the concurrency slots however the request ended."""


class Policy(Protocol):
    async def authenticate(self, authorization: str | None) -> Caller: ...

    def check_model(self, caller: Caller, model: str) -> None: ...

    async def admit(self, caller: Caller, prompt_tokens: int) -> Admission: ...
