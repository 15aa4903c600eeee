"""Engine requests from what callers submit: checked against the engine's
limits (`RequestLimits`), and the engine's defaults filled in where the
request left them to it (None)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .config import EngineConfig
from .core.request import OutputCallback, Request
from .core.request_limits import RequestLimits
from .core.sampling_params import SamplingParams


class RequestBuilder:
    def __init__(self, config: EngineConfig, limits: RequestLimits, eos_token_ids: Sequence[int]) -> None:
        self.default_max_tokens = config.default_max_tokens
        self.default_token_timeout_ms = config.default_token_timeout_ms
        self.limits = limits
        self.eos_token_ids = [int(t) for t in eos_token_ids]

    def build(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        priority: int,
        on_output: OutputCallback | None,
        continuation_ids: Sequence[int] = (),
    ) -> Request:
        """Raises InvalidRequestError naming the field."""
        prompt = [int(t) for t in prompt_token_ids]
        continuation = [int(t) for t in continuation_ids]
        max_tokens = self.default_max_tokens if sampling.max_tokens is None else sampling.max_tokens
        self.limits.check(prompt, continuation, sampling, max_tokens)
        # an explicit [] of stop ids stays: no stop token
        if sampling.max_tokens is None or sampling.stop_token_ids is None:
            stop_ids = list(self.eos_token_ids) if sampling.stop_token_ids is None else sampling.stop_token_ids
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens, stop_token_ids=stop_ids)
        timeout_ms = sampling.token_timeout_ms
        if timeout_ms is None:
            timeout_ms = self.default_token_timeout_ms
        return Request(
            request_id,
            prompt,
            sampling,
            priority=int(priority),
            token_timeout_ms=timeout_ms,
            on_output=on_output,
            continuation_ids=continuation,
        )
