"""What a request may ask of this engine, checked before it is queued: the
request's own rules (SamplingParams.validate), then what depends on the
model, the context length and the KV cache. Each error names its field."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidRequestError
from .sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestLimits:
    max_tokens_limit: int  # largest max_tokens a request may ask
    vocab_size: int
    max_model_len: int
    kv_capacity_tokens: int | None  # None: the engine behind checks its KV cache itself (TensorRT-LLM)
    prompt_token_budget: int | None  # longest prompt when chunked context is off; None: no limit

    def check(self, prompt: list[int], continuation: list[int], sampling: SamplingParams, max_tokens: int) -> None:
        """`max_tokens` is the request's or the engine's default. A
        continuation is output already generated: `max_tokens` covers it, and
        so does the context check (prompt + max_tokens)."""
        n = len(prompt)
        if n == 0:
            raise InvalidRequestError("input_ids", "must not be empty")
        sampling.validate()
        if max_tokens > self.max_tokens_limit:
            raise InvalidRequestError("max_tokens", f"must be <= {self.max_tokens_limit}, got {max_tokens}")
        if len(continuation) >= max_tokens:
            raise InvalidRequestError(
                "continuation_ids",
                f"{len(continuation)} ids leave nothing to generate "
                f"within max_tokens {max_tokens} (they count as output)",
            )
        vocab = self.vocab_size
        for name, ids in (("input_ids", prompt), ("continuation_ids", continuation)):
            if ids and (min(ids) < 0 or max(ids) >= vocab):
                raise InvalidRequestError(name, f"token ids must be in [0, {vocab})")
        for name, words in (("stop_words_ids", sampling.stop_words_ids), ("bad_words_ids", sampling.bad_words_ids)):
            if any(t < 0 or t >= vocab for word in words for t in word):
                raise InvalidRequestError(name, f"token ids must be in [0, {vocab})")
        if n >= self.max_model_len:
            raise InvalidRequestError(
                "input_ids", f"{n} tokens leave no room to generate (max_model_len {self.max_model_len})"
            )
        total = n + max_tokens
        if total > self.max_model_len:
            raise InvalidRequestError(
                "max_tokens",
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds max_model_len {self.max_model_len}",
            )
        if self.kv_capacity_tokens is not None and total > self.kv_capacity_tokens:
            raise InvalidRequestError(
                "max_tokens",
                f"prompt + max_tokens ({total} tokens) exceeds the KV cache ({self.kv_capacity_tokens} tokens)",
            )
        if self.prompt_token_budget is not None and n > self.prompt_token_budget:
            raise InvalidRequestError(
                "input_ids",
                f"{n} tokens exceed max_num_batched_tokens {self.prompt_token_budget} (chunked context is off)",
            )
