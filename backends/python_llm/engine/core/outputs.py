"""What the engine reports per request and step (a delta), and the whole
result the offline `generate` helpers assemble from those deltas."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestOutput:
    """One step's news for one request: the tokens it produced, or its end.

    `new_token_ids` never holds the EOS id that ended a request (TensorRT-LLM
    returns ids up to, not including, end_id); stop-word tokens are returned
    and the text stages strip them. Times are wall clock (time.time_ns()).
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float] | None
    finished: bool
    finish_reason: str | None
    error: str | None
    num_prompt_tokens: int
    num_output_tokens: int  # returned so far, this delta included
    num_cached_prompt_tokens: int
    cum_log_prob: float | None
    arrival_time_ns: int
    first_token_time_ns: int | None
    last_token_time_ns: int | None


@dataclass
class GenerateResult:
    """A finished request as `LLMEngine.generate_results` returns it."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    cum_log_prob: float | None = None
    arrival_time_ns: int = 0
    first_token_time_ns: int | None = None
    last_token_time_ns: int | None = None

    def add(self, out: RequestOutput) -> None:
        self.token_ids.extend(out.new_token_ids)
        if out.new_logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(out.new_logprobs)
        self.finish_reason = out.finish_reason
        self.error = out.error
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_cached_prompt_tokens = out.num_cached_prompt_tokens
        self.cum_log_prob = out.cum_log_prob
        self.arrival_time_ns = out.arrival_time_ns
        self.first_token_time_ns = out.first_token_time_ns
        self.last_token_time_ns = out.last_token_time_ns
