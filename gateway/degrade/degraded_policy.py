"""The degradation levels applied at the access-control seam (gateway/
core/policy.py), which every door goes through (the OpenAI routes, the Responses
API, Triton's HTTP routes and the gRPC door): authentication hands out the
caller as the current level serves it (the capped tier, one-piece streams),
admission refuses a shed tier before the wrapped policy spends anything on it
(no slot taken, no request counted)."""

from __future__ import annotations

from ..core.policy import Admission, Caller, Policy
from .degradation import Degradation


class DegradingPolicy:
    def __init__(self, inner: Policy, degradation: Degradation) -> None:
        self.inner = inner
        self.degradation = degradation

    async def authenticate(self, authorization: str | None) -> Caller:
        return self.degradation.apply(await self.inner.authenticate(authorization))

    def check_model(self, caller: Caller, model: str) -> None:
        self.inner.check_model(caller, model)

    async def admit(self, caller: Caller, prompt_tokens: int) -> Admission:
        refusal = self.degradation.refusal(caller)
        if refusal is not None:
            raise refusal
        return await self.inner.admit(caller, prompt_tokens)
